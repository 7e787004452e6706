// Communication plugin over NCCL: CUDA device buffers only. Torch-free: the C
// ABI headers, the CUDA runtime and NCCL.
//
// Every NCCL communicator here is nonblocking (ncclConfig_t::blocking = 0):
// NCCL calls return at once and the plugin polls ncclCommGetAsyncError against
// the communicator's timeout, so a rank whose peer never comes gets
// SP_ERR_TIMEOUT and an aborted communicator instead of hanging inside
// ncclCommInitRank or ncclGroupEnd, and abort() from another thread can always
// get in.
//
// Streams: an operation runs on its buffer's stream, or on the communicator's
// own stream when that is NULL. When consecutive operations of a communicator
// use different streams, the later stream first waits for the earlier one's
// completion event: the ABI promises completion in issue order, and NCCL needs
// every rank to launch a communicator's kernels in one order.
//
// Point to point: NCCL has no tags, and its send and recv kernels wait for the
// peer's matching kernel, so the common "irecv, isend, wait both" exchange
// between two ranks would deadlock if each call launched at once. send/recv
// are therefore held back and launched together, as one ncclGroupStart/End,
// when anything else happens on the communicator (a collective, a split, a
// blocking send/recv) or a wait or test asks for one of them. Messages between
// two ranks match in the order they were issued; the tag is not used, and a
// send to self completes only in the same launch as its recv.
//
// The pieces: comm.h (a communicator and one operation's state; comm.cpp its
// launches, polls and abort, comm_split.cpp its split), launch.h (issuing one
// operation), store.h (the host's store, NCCL's unique ids), validation.h
// (argument checks), nccl_support.h (CUDA and NCCL statuses, dtypes and ops,
// devices, events, nonblocking calls).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "comm.h"
#include "launch.h"
#include "nccl_support.h"
#include "shardplan/abi/comm.h"
#include "shardplan/abi/plugin.h"
#include "shardplan/comm_dtype.h"
#include "shardplan/comm_plugin.h"
#include "store.h"
#include "validation.h"

namespace sp_nccl {
namespace {

using shardplan::comm::dtype_size;
using shardplan::comm::overlaps;

char* at(void* p, size_t offset) { return static_cast<char*>(p) + offset; }
const char* at(const void* p, size_t offset) { return static_cast<const char*>(p) + offset; }

// ---------------------------------------------------------------- create

struct Options {
  int device = -1;
  int local_rank = -1;
  std::string prefix;
  std::string split;  // "", "nccl" or "store"
  std::string bad;    // the first malformed option
};

bool parse_int(const std::string& v, int* out) {
  if (v.empty() || v.size() > 9 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  *out = std::stoi(v);
  return true;
}

Options parse_options(const char* const* options) {
  Options o;
  shardplan::comm::for_each_option(options, [&](const std::string& k, const std::string& v) {
    if (k == "device" || k == "local_rank") {
      if (!parse_int(v, k == "device" ? &o.device : &o.local_rank) && o.bad.empty()) o.bad = k + "=" + v;
    } else if (k == "prefix") {
      o.prefix = v;
    } else if (k == "split") {
      if (v != "nccl" && v != "store" && o.bad.empty()) o.bad = k + "=" + v;
      o.split = v;
    }
  });
  return o;
}

int api_create(const sp_comm_config* config, sp_comm** out) {
  if (int rc = shardplan::comm::check_create("nccl", config, out)) return rc;
  const int rank = config->rank, size = config->world_size;
  const ms timeout = shardplan::comm::timeout_of(*config);
  const std::string who = "nccl create (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")";
  const Options opt = parse_options(config->options);
  if (!opt.bad.empty())
    return fail(SP_ERR_INVALID, who + ": bad option '" + opt.bad +
                                    "' (device=<index>, local_rank=<index>, split=nccl|store)");

  int count = 0;
  cudaError_t ce = cudaGetDeviceCount(&count);
  if (ce != cudaSuccess || count == 0)
    return fail(SP_ERR_UNSUPPORTED, who + ": no CUDA device: cudaGetDeviceCount returned " +
                                        (ce != cudaSuccess ? cuda_msg(ce) : std::string("0 devices")));
  int device = opt.device >= 0 ? opt.device : opt.local_rank >= 0 ? opt.local_rank : rank % count;
  if (device >= count)
    return fail(SP_ERR_INVALID, who + ": " + (opt.device >= 0 ? "device=" : "local_rank=") + std::to_string(device) +
                                    " but this process sees " + std::to_string(count) + " CUDA device(s)");

  std::shared_ptr<Store> store;
  if (config->store) store = std::make_shared<Store>(*config->store);
  else if (size > 1)
    return fail(SP_ERR_INVALID, who + ": no store: ranks share NCCL's unique id through the host's store");

  std::string err;
  // A store may outlive one world (tests create several in a row); each rank
  // counts its own earlier worlds on it, and all ranks count alike.
  std::string prefix = opt.prefix;
  if (prefix.empty() && store) {
    int gen = 0;
    auto key = [&](int g) { return "nccl/gen/" + std::to_string(g) + "/" + std::to_string(rank); };
    for (bool exists = true;; ++gen) {
      if (int rc = store->check(key(gen), &exists, &err)) return fail(rc, who + ": " + err);
      if (!exists) break;
    }
    if (int rc = store->set(key(gen), "1", 1, &err)) return fail(rc, who + ": " + err);
    prefix = "nccl/" + std::to_string(gen);
  }
  if (prefix.empty()) prefix = "nccl";

  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return fail(status_of(r), who + ": ncclGetUniqueId: " + nccl_msg(nullptr, r));
    if (size > 1)
      if (int rc = publish_id(*store, prefix + "/id", id, &err)) return fail(rc, who + ": " + err);
  } else if (int rc = fetch_id(*store, prefix + "/id", timeout, nullptr, &id, &err)) {
    return fail(rc, who + ": " + err);
  }

  const bool via_store = opt.split == "store" || !SP_NCCL_HAS_COMM_SPLIT;
  auto comm = std::make_shared<Comm>(rank, size, device, timeout, store, prefix, via_store);
  if (int rc = comm->init(&id, nullptr, nullptr, &err))
    return fail(rc, who + " on cuda:" + std::to_string(device) + ": " + err);
  *out = new sp_comm{comm};
  return SP_OK;
}

// ----------------------------------------------------------------- split

int api_split(sp_comm* parent, int32_t color, int32_t key, sp_comm** out) {
  if (!out) return fail(SP_ERR_INVALID, "nccl split: out is NULL");
  *out = nullptr;
  if (int rc = check_comm("split", parent)) return rc;
  Comm* p = parent->impl.get();
  std::shared_ptr<Comm> child;
  std::string err;
  if (int rc = p->split(color, key, &child, &err)) return fail(rc, p->what("split") + ": " + err);
  if (child) {
    p->children.adopt(child, p->aborted);
    *out = new sp_comm{child};
  }
  return SP_OK;
}

int api_abort(sp_comm* comm) {
  if (!comm || !comm->impl) return fail(SP_ERR_INVALID, "nccl abort: NULL communicator");
  comm->impl->abort();
  return SP_OK;
}

void api_destroy(sp_comm* comm) {
  if (!comm) return;
  if (comm->impl) comm->impl->destroy();
  delete comm;
}

int32_t api_rank(const sp_comm* comm) { return comm && comm->impl ? comm->impl->rank : -1; }
int32_t api_size(const sp_comm* comm) { return comm && comm->impl ? comm->impl->size : -1; }

// ----------------------------------------------------------- collectives

int bad_op(const Comm& c, const char* name, int32_t op) {
  return fail(SP_ERR_INVALID, c.what(name) + ": unknown reduce op " + std::to_string(op));
}

int api_all_reduce(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t op, sp_work** work) {
  const char* name = "all_reduce";
  if (int rc = check_comm(name, comm)) return rc;
  Comm* c = comm->impl.get();
  if (int rc = check_pair(*c, name, send, recv)) return rc;
  if (send->count != recv->count)
    return count_mismatch(*c, name, "send has " + std::to_string(send->count) + " elements but recv has " +
                                        std::to_string(recv->count));
  ncclRedOp_t rop;
  if (!nccl_op(op, &rop)) return bad_op(*c, name, op);
  const sp_buffer s = *send, r = *recv;
  const size_t bytes = r.count * dtype_size(r.dtype);
  return c->run(name, recv, send, [&](Launch& l) -> ncclResult_t {
    if (r.count == 0) return ncclSuccess;
    const void* src = s.data;
    if (src != r.data && overlaps(src, bytes, r.data, bytes) && !(src = l.stage(src, bytes))) return ncclSuccess;
    return ncclAllReduce(src, r.data, r.count, dt_of(r), rop, l.nccl, l.stream);
  }, work);
}

int api_all_gather(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, sp_work** work) {
  const char* name = "all_gather";
  if (int rc = check_comm(name, comm)) return rc;
  Comm* c = comm->impl.get();
  if (int rc = check_pair(*c, name, send, recv)) return rc;
  if (recv->count != send->count * c->size)
    return count_mismatch(*c, name, "recv has " + std::to_string(recv->count) + " elements, expected send's " +
                                        std::to_string(send->count) + " x " + std::to_string(c->size) + " ranks");
  const sp_buffer s = *send, r = *recv;
  const size_t chunk = s.count * dtype_size(s.dtype);
  return c->run(name, recv, send, [&](Launch& l) -> ncclResult_t {
    if (s.count == 0) return ncclSuccess;
    const void* src = s.data;
    // NCCL's in-place form is this rank's block of recv; any other overlap
    // would be overwritten by a peer's block before it is sent.
    if (src != at(r.data, chunk * c->rank) && overlaps(src, chunk, r.data, chunk * c->size) &&
        !(src = l.stage(src, chunk)))
      return ncclSuccess;
    return ncclAllGather(src, r.data, s.count, dt_of(r), l.nccl, l.stream);
  }, work);
}

int api_reduce_scatter(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t op, sp_work** work) {
  const char* name = "reduce_scatter";
  if (int rc = check_comm(name, comm)) return rc;
  Comm* c = comm->impl.get();
  if (int rc = check_pair(*c, name, send, recv)) return rc;
  if (send->count != recv->count * c->size)
    return count_mismatch(*c, name, "send has " + std::to_string(send->count) + " elements, expected recv's " +
                                        std::to_string(recv->count) + " x " + std::to_string(c->size) + " ranks");
  ncclRedOp_t rop;
  if (!nccl_op(op, &rop)) return bad_op(*c, name, op);
  const sp_buffer s = *send, r = *recv;
  const size_t chunk = r.count * dtype_size(r.dtype);
  return c->run(name, recv, send, [&](Launch& l) -> ncclResult_t {
    if (r.count == 0) return ncclSuccess;
    const void* src = s.data;
    if (r.data != at(src, chunk * c->rank) && overlaps(src, chunk * c->size, r.data, chunk) &&
        !(src = l.stage(src, chunk * c->size)))
      return ncclSuccess;
    return ncclReduceScatter(src, r.data, r.count, dt_of(r), rop, l.nccl, l.stream);
  }, work);
}

int api_broadcast(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work) {
  const char* name = "broadcast";
  if (int rc = check_comm(name, comm)) return rc;
  Comm* c = comm->impl.get();
  if (int rc = check_root(*c, name, root)) return rc;
  const bool is_root = c->rank == root;
  if (int rc = is_root ? check_pair(*c, name, send, recv) : check_buffer(*c, name, "recv", recv)) return rc;
  if (is_root && send->count != recv->count)
    return count_mismatch(*c, name, "send has " + std::to_string(send->count) + " elements but recv has " +
                                        std::to_string(recv->count));
  // Elsewhere than at the root, send may be a dummy; NCCL does not read it.
  const sp_buffer s = is_root ? *send : *recv, r = *recv;
  const size_t bytes = r.count * dtype_size(r.dtype);
  return c->run(name, recv, is_root ? send : nullptr, [&](Launch& l) -> ncclResult_t {
    if (r.count == 0) return ncclSuccess;
    const void* src = s.data;
    if (is_root && src != r.data && overlaps(src, bytes, r.data, bytes) && !(src = l.stage(src, bytes)))
      return ncclSuccess;
    return ncclBroadcast(src, r.data, r.count, dt_of(r), root, l.nccl, l.stream);
  }, work);
}

int api_scatter(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work) {
  const char* name = "scatter";
  if (int rc = check_comm(name, comm)) return rc;
  Comm* c = comm->impl.get();
  if (int rc = check_root(*c, name, root)) return rc;
  const bool is_root = c->rank == root;
  if (int rc = is_root ? check_pair(*c, name, send, recv) : check_buffer(*c, name, "recv", recv)) return rc;
  if (is_root && send->count != recv->count * c->size)
    return count_mismatch(*c, name, "send has " + std::to_string(send->count) + " elements, expected recv's " +
                                        std::to_string(recv->count) + " x " + std::to_string(c->size) + " ranks");
  const sp_buffer s = is_root ? *send : *recv, r = *recv;
  const size_t chunk = r.count * dtype_size(r.dtype);
  const int size = c->size;
  return c->run(name, recv, is_root ? send : nullptr, [&](Launch& l) -> ncclResult_t {
    if (r.count == 0) return ncclSuccess;
    const ncclDataType_t dt = dt_of(r);
    if (!is_root) return grouped([&] { return ncclRecv(r.data, r.count, dt, root, l.nccl, l.stream); });
    const void* src = s.data;
    // recv may be one of the blocks still to be sent (the root's own block
    // in place is fine: it is copied onto itself).
    if (r.data != at(src, chunk * root) && overlaps(src, chunk * size, r.data, chunk) &&
        !(src = l.stage(src, chunk * size)))
      return ncclSuccess;
    // Local copies go before the group: a nonblocking group may reach the
    // stream only when it settles, after anything issued behind it.
    l.copy(r.data, at(src, chunk * root), chunk);
    if (size == 1) return ncclSuccess;
    return grouped([&] {
      for (int p = 0; p < size; ++p) {
        if (p == root) continue;
        ncclResult_t x = ncclSend(at(src, chunk * p), r.count, dt, p, l.nccl, l.stream);
        if (x != ncclSuccess) return x;
      }
      return ncclSuccess;
    });
  }, work);
}

int api_gather(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work) {
  const char* name = "gather";
  if (int rc = check_comm(name, comm)) return rc;
  Comm* c = comm->impl.get();
  if (int rc = check_root(*c, name, root)) return rc;
  const bool is_root = c->rank == root;
  if (int rc = is_root ? check_pair(*c, name, send, recv) : check_buffer(*c, name, "send", send)) return rc;
  if (is_root && recv->count != send->count * c->size)
    return count_mismatch(*c, name, "recv has " + std::to_string(recv->count) + " elements, expected send's " +
                                        std::to_string(send->count) + " x " + std::to_string(c->size) + " ranks");
  const sp_buffer s = *send, r = is_root ? *recv : *send;
  const size_t chunk = s.count * dtype_size(s.dtype);
  const int size = c->size;
  return c->run(name, is_root ? recv : send, is_root ? send : nullptr, [&](Launch& l) -> ncclResult_t {
    if (s.count == 0) return ncclSuccess;
    const ncclDataType_t dt = dt_of(s);
    if (!is_root) return grouped([&] { return ncclSend(s.data, s.count, dt, root, l.nccl, l.stream); });
    const void* src = s.data;
    // Peers' blocks may land on our input before it is copied into place.
    if (src != at(r.data, chunk * root) && overlaps(src, chunk, r.data, chunk * size) && !(src = l.stage(src, chunk)))
      return ncclSuccess;
    l.copy(at(r.data, chunk * root), src, chunk);
    if (size == 1) return ncclSuccess;
    return grouped([&] {
      for (int p = 0; p < size; ++p) {
        if (p == root) continue;
        ncclResult_t x = ncclRecv(at(r.data, chunk * p), s.count, dt, p, l.nccl, l.stream);
        if (x != ncclSuccess) return x;
      }
      return ncclSuccess;
    });
  }, work);
}

int api_all_to_all(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, sp_work** work) {
  const char* name = "all_to_all";
  if (int rc = check_comm(name, comm)) return rc;
  Comm* c = comm->impl.get();
  if (int rc = check_pair(*c, name, send, recv)) return rc;
  if (send->count != recv->count || send->count % c->size != 0)
    return count_mismatch(*c, name, "send has " + std::to_string(send->count) + " and recv " +
                                        std::to_string(recv->count) +
                                        " elements; both must be equal and divisible by " + std::to_string(c->size));
  const sp_buffer s = *send, r = *recv;
  const int size = c->size, me = c->rank;
  const uint64_t n = r.count / size;
  const size_t chunk = n * dtype_size(r.dtype), total = chunk * size;
  return c->run(name, recv, send, [&](Launch& l) -> ncclResult_t {
    if (n == 0) return ncclSuccess;
    const ncclDataType_t dt = dt_of(r);
    const void* src = s.data;
    if (overlaps(src, total, r.data, total) && !(src = l.stage(src, total))) return ncclSuccess;
    l.copy(at(r.data, chunk * me), at(src, chunk * me), chunk);
    if (size == 1) return ncclSuccess;
    return grouped([&] {
      for (int p = 0; p < size; ++p) {
        if (p == me) continue;
        ncclResult_t x = ncclSend(at(src, chunk * p), n, dt, p, l.nccl, l.stream);
        if (x == ncclSuccess) x = ncclRecv(at(r.data, chunk * p), n, dt, p, l.nccl, l.stream);
        if (x != ncclSuccess) return x;
      }
      return ncclSuccess;
    });
  }, work);
}

int point_to_point(bool is_send, sp_comm* comm, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work) {
  const char* name = is_send ? "send" : "recv";
  if (int rc = check_comm(name, comm)) return rc;
  Comm* c = comm->impl.get();
  if (int rc = check_buffer(*c, name, "buffer", buf)) return rc;
  if (peer < 0 || peer >= c->size)
    return fail(SP_ERR_INVALID, c->what(name) + ": peer " + std::to_string(peer) + " is outside the group of " +
                                    std::to_string(c->size));
  return c->post(is_send, *buf, peer, dt_of(*buf), work);
}

int api_send(sp_comm* comm, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work) {
  return point_to_point(true, comm, buf, peer, tag, work);
}

int api_recv(sp_comm* comm, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work) {
  return point_to_point(false, comm, buf, peer, tag, work);
}

int api_barrier(sp_comm* comm, sp_work** work) {
  const char* name = "barrier";
  if (int rc = check_comm(name, comm)) return rc;
  Comm* c = comm->impl.get();
  // On the communicator's own stream, ordered after everything issued
  // before, so a blocking barrier also means "all my operations are done".
  return c->run(name, nullptr, nullptr, [&](Launch& l) -> ncclResult_t {
    return ncclAllReduce(c->barrier_scalar(), c->barrier_scalar(), 1, ncclFloat32, ncclSum, l.nccl, l.stream);
  }, work);
}

// ------------------------------------------------------------------ work

int api_wait(sp_work* work, int64_t timeout_ms) {
  if (!work || !work->state) return fail(SP_ERR_INVALID, "nccl wait: NULL work");
  return wait_state(*work->state, timeout_ms);
}

int api_test(sp_work* work, int32_t* done) {
  if (!work || !work->state || !done) return fail(SP_ERR_INVALID, "nccl test: NULL work or done");
  WorkState& st = *work->state;
  const bool finished = st.comm->poll(st);
  *done = finished ? 1 : 0;
  return finished ? report(st) : SP_OK;
}

void api_release(sp_work* work) { delete work; }

#define SP_STR2(x) #x
#define SP_STR(x) SP_STR2(x)

}  // namespace
}  // namespace sp_nccl

SHARDPLAN_COMM_PLUGIN(sp_nccl, "nccl", SP_CAP_CUDA | SP_CAP_PROCESS_RANKS,
                      "shardplan nccl plugin 0.1 (built with NCCL " SP_STR(NCCL_MAJOR) "." SP_STR(NCCL_MINOR) "." SP_STR(
                          NCCL_PATCH) ")")
