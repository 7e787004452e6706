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

// Before nccl.h: older NCCL releases declare ncclBfloat16 only where
// __CUDA_BF16_TYPES_EXIST__ is defined, which this header does.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "shardplan/abi/comm.h"
#include "shardplan/abi/plugin.h"
#include "shardplan/comm_dtype.h"
#include "shardplan/comm_plugin.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "the nccl plugin needs NCCL 2.14 or newer (nonblocking communicators)"
#endif
// ncclCommSplit came with 2.18; before it, split meets through the store.
#define SP_NCCL_HAS_COMM_SPLIT (NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0))

namespace sp_nccl {
class Comm;
struct WorkState;
}  // namespace sp_nccl

struct sp_comm {
  std::shared_ptr<sp_nccl::Comm> impl;
};

struct sp_work {
  std::shared_ptr<sp_nccl::WorkState> state;
};

namespace sp_nccl {
namespace {

using Clock = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;
using shardplan::comm::dtype_name;
using shardplan::comm::dtype_size;
using shardplan::comm::fail;
using shardplan::comm::overlaps;

std::string cuda_msg(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

std::string nccl_msg(ncclComm_t comm, ncclResult_t r) {
  std::string m = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) m += std::string(" (") + last + ")";
  return m;
}

int status_of(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return SP_OK;
    case ncclInvalidArgument:
    case ncclInvalidUsage: return SP_ERR_INVALID;
    default: return SP_ERR_INTERNAL;
  }
}

bool nccl_dtype(int32_t dt, ncclDataType_t* out) {
  switch (dt) {
    case SP_FLOAT32: *out = ncclFloat32; return true;
    case SP_FLOAT64: *out = ncclFloat64; return true;
    case SP_FLOAT16: *out = ncclFloat16; return true;
    case SP_BFLOAT16: *out = ncclBfloat16; return true;
    case SP_INT8: *out = ncclInt8; return true;
    case SP_UINT8: *out = ncclUint8; return true;
    case SP_INT32: *out = ncclInt32; return true;
    case SP_INT64: *out = ncclInt64; return true;
    default: return false;
  }
}

bool nccl_op(int32_t op, ncclRedOp_t* out) {
  switch (op) {
    case SP_SUM: *out = ncclSum; return true;
    case SP_MAX: *out = ncclMax; return true;
    case SP_MIN: *out = ncclMin; return true;
    case SP_PROD: *out = ncclProd; return true;
    default: return false;
  }
}

char* at(void* p, size_t offset) { return static_cast<char*>(p) + offset; }
const char* at(const void* p, size_t offset) { return static_cast<const char*>(p) + offset; }

// The host thread's current device belongs to the caller (torch keeps its
// own notion of it); the plugin switches only for the duration of a call.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) == cudaSuccess && prev_ != device) cudaSetDevice(device);
    else prev_ = -1;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// Polls spin briefly before they sleep: an operation on idle GPUs often ends
// within microseconds, and a sleep would add the scheduler's latency to it.
class Backoff {
 public:
  void pause() {
    if (n_ < 200) {
      ++n_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(nap_);
    nap_ = std::min(nap_ * 2, std::chrono::microseconds(100));
  }

 private:
  int n_ = 0;
  std::chrono::microseconds nap_{20};
};

struct Event {
  explicit Event(int device) : device(device) {}
  ~Event() {
    if (ev) {
      DeviceGuard g(device);
      cudaEventDestroy(ev);
    }
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  const int device;
  cudaEvent_t ev = nullptr;
};

// NCCL's nonblocking calls return ncclInProgress until the communicator is
// ready for the next call. Gives up on `cancel` or at the deadline.
int settle(ncclComm_t comm, ncclResult_t r, Clock::time_point deadline, const std::atomic<bool>& cancel,
           const std::atomic<bool>* cancel2, std::string* err) {
  Backoff backoff;
  while (r == ncclInProgress) {
    if (cancel || (cancel2 && *cancel2)) {
      *err = "the communicator was aborted";
      return SP_ERR_ABORTED;
    }
    if (Clock::now() > deadline) {
      *err = "NCCL did not finish the call within the communicator's timeout";
      return SP_ERR_TIMEOUT;
    }
    backoff.pause();
    ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) r = q;
  }
  if (r != ncclSuccess) {
    *err = nccl_msg(comm, r);
    return status_of(r);
  }
  return SP_OK;
}

// ------------------------------------------------------------------ store

// The host's rendezvous store, for NCCL's unique ids.
class Store {
 public:
  explicit Store(const sp_store& s) : s_(s) {}

  int set(const std::string& key, const void* data, size_t len, std::string* err) {
    if (s_.set(s_.ctx, key.c_str(), data, len) == 0) return SP_OK;
    *err = why("setting", key);
    return SP_ERR_INTERNAL;
  }

  int check(const std::string& key, bool* exists, std::string* err) {
    int e = 0;
    if (s_.check(s_.ctx, key.c_str(), &e) != 0) {
      *err = why("looking up", key);
      return SP_ERR_INTERNAL;
    }
    *exists = e != 0;
    return SP_OK;
  }

  // Waits by polling check() so that `cancel` (an abort) can end a wait for
  // a peer that will never publish, e.g. one that failed before a split.
  int get(const std::string& key, std::vector<char>* out, ms timeout, const std::atomic<bool>* cancel,
          std::string* err) {
    if (cancel) {
      const auto deadline = Clock::now() + timeout;
      auto nap = ms(1);
      for (;;) {
        bool exists = false;
        if (int rc = check(key, &exists, err)) return rc;
        if (exists) break;
        if (*cancel) {
          *err = "aborted while waiting for key '" + key + "' in the store";
          return SP_ERR_ABORTED;
        }
        if (Clock::now() > deadline) {
          *err = "timed out after " + std::to_string(timeout.count()) + " ms waiting for key '" + key +
                 "' in the store";
          return SP_ERR_TIMEOUT;
        }
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, ms(50));
      }
    }
    void* data = nullptr;
    size_t len = 0;
    int rc = s_.get(s_.ctx, key.c_str(), &data, &len, timeout.count());
    if (rc != 0) {
      std::free(data);
      *err = why("waiting for", key);
      return rc == SP_ERR_TIMEOUT ? SP_ERR_TIMEOUT : SP_ERR_INTERNAL;
    }
    out->assign(static_cast<char*>(data), static_cast<char*>(data) + len);
    std::free(data);
    return SP_OK;
  }

 private:
  std::string why(const char* what, const std::string& key) const {
    const char* e = s_.last_error ? s_.last_error(s_.ctx) : nullptr;
    return (e && *e) ? std::string(e) : std::string(what) + " key '" + key + "' in the store failed";
  }

  // A copy: the host keeps ctx alive, not necessarily the struct.
  sp_store s_;
};

int publish_id(Store& store, const std::string& key, const ncclUniqueId& id, std::string* err) {
  return store.set(key, &id, sizeof id, err);
}

int fetch_id(Store& store, const std::string& key, ms timeout, const std::atomic<bool>* cancel, ncclUniqueId* id,
             std::string* err) {
  std::vector<char> v;
  if (int rc = store.get(key, &v, timeout, cancel, err)) return rc;
  if (v.size() != sizeof *id) {
    *err = "key '" + key + "' holds " + std::to_string(v.size()) + " bytes, not an NCCL unique id of " +
           std::to_string(sizeof *id);
    return SP_ERR_INTERNAL;
  }
  std::memcpy(id, v.data(), sizeof *id);
  return SP_OK;
}

// What an operation's issuing code may need beyond NCCL itself.
struct Launch {
  cudaStream_t stream = nullptr;
  ncclComm_t nccl = nullptr;
  std::string error;           // the first CUDA failure
  std::vector<void*> scratch;  // freed in stream order once the operation is enqueued

  bool cuda(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    if (error.empty()) error = std::string(what) + " failed: " + cuda_msg(e);
    return false;
  }
  // A private copy of an input that overlaps the output in a way NCCL does
  // not allow (NCCL's in-place forms only are safe).
  const void* stage(const void* src, size_t bytes) {
    void* p = nullptr;
    if (!cuda(cudaMallocAsync(&p, bytes, stream), "cudaMallocAsync")) return nullptr;
    scratch.push_back(p);
    if (!cuda(cudaMemcpyAsync(p, src, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync")) return nullptr;
    return p;
  }
  bool copy(void* dst, const void* src, size_t bytes) {
    if (dst == src || bytes == 0) return true;
    return cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
  }
};

// Closes a group even when an operation inside it was refused, as NCCL
// requires; reports the first failure.
template <typename Fn>
ncclResult_t grouped(Fn&& fn) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  r = fn();
  ncclResult_t e = ncclGroupEnd();
  return r != ncclSuccess ? r : e;
}

}  // namespace

struct WorkState {
  WorkState(std::shared_ptr<Comm> comm, const char* op) : comm(std::move(comm)), op(op) {}
  const std::shared_ptr<Comm> comm;
  const char* const op;  // a string literal
  // Guarded by comm->mu.
  bool pending = false;          // a held-back send/recv, not launched yet
  std::shared_ptr<Event> event;  // set once launched
  Clock::time_point issued;
  bool done = false;
  int status = SP_OK;
  std::string error;

  void finish(int st, std::string err) {
    done = true;
    status = st;
    error = std::move(err);
  }
};

class Comm : public std::enable_shared_from_this<Comm> {
 public:
  Comm(int rank, int size, int device, ms timeout, std::shared_ptr<Store> store, std::string prefix,
       bool split_via_store)
      : rank(rank), size(size), device(device), timeout(timeout), store(std::move(store)), prefix(std::move(prefix)),
        split_via_store(split_via_store) {}

  ~Comm() {
    DeviceGuard g(device);
    if (nccl) ncclCommAbort(nccl);  // only when destroy() never ran
    if (scalar) cudaFree(scalar);
    if (stream) cudaStreamDestroy(stream);
  }

  const int rank;
  const int size;
  const int device;
  const ms timeout;
  const std::shared_ptr<Store> store;  // null for a world of one without a store
  const std::string prefix;            // this communicator's keys in `store`
  const bool split_via_store;
  std::atomic<bool> aborted{false};

  void* barrier_scalar() const { return scalar; }  // set once by init()

  std::string what(const char* op) const {
    return std::string("nccl ") + op + " on rank " + std::to_string(rank) + " of " + std::to_string(size) +
           " (cuda:" + std::to_string(device) + ")";
  }

  // Creates the stream, the barrier's scalar and the NCCL communicator (or
  // adopts `made`, one ncclCommSplit already settled). `cancel`: the parent's
  // abort flag while a split creates this communicator.
  int init(const ncclUniqueId* id, ncclComm_t made, const std::atomic<bool>* cancel, std::string* err) {
    std::lock_guard<std::mutex> lock(mu_);
    DeviceGuard g(device);
    Launch l;
    // A blocking stream (not cudaStreamNonBlocking) on purpose: callers that
    // pass no stream typically produced the data on the legacy default
    // stream, with which such a stream is implicitly ordered.
    if (!l.cuda(cudaStreamCreateWithFlags(&stream, cudaStreamDefault), "cudaStreamCreate") ||
        !l.cuda(cudaMalloc(&scalar, sizeof(float)), "cudaMalloc") ||
        !l.cuda(cudaMemset(scalar, 0, sizeof(float)), "cudaMemset")) {
      if (made) ncclCommAbort(made);
      *err = l.error;
      return SP_ERR_INTERNAL;
    }
    if (made) {
      nccl = made;
      return SP_OK;
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&nccl, size, *id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      *err = "ncclCommInitRankConfig: " + nccl_msg(nccl, r);
      if (nccl) ncclCommAbort(nccl);
      nccl = nullptr;
      return status_of(r);
    }
    int rc = settle(nccl, r, Clock::now() + timeout, aborted, cancel, err);
    if (rc != SP_OK) {
      *err = "ncclCommInitRankConfig: " + *err;
      if (rc == SP_ERR_TIMEOUT)
        *err += " (" + std::to_string(timeout.count()) + " ms; did every rank of the group start?)";
      ncclCommAbort(nccl);
      nccl = nullptr;
    }
    return rc;
  }

  // Issues one operation: `issue(launch)` enqueues it on launch.stream and
  // returns NCCL's result. `main`/`other`: the buffers whose streams matter,
  // `other` may be null. work == nullptr: waits for completion.
  template <typename Issue>
  int run(const char* op, const sp_buffer* main, const sp_buffer* other, Issue&& issue, sp_work** work) {
    auto state = std::make_shared<WorkState>(shared_from_this(), op);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted || !nccl) return fail(SP_ERR_ABORTED, what(op) + ": the communicator was aborted");
      DeviceGuard g(device);
      flush_locked();
      Launch l;
      l.nccl = nccl;
      l.stream = main && main->stream ? static_cast<cudaStream_t>(main->stream) : stream;
      cudaStream_t join = other && other->stream ? static_cast<cudaStream_t>(other->stream) : nullptr;
      int rc = SP_OK;
      std::string err;
      if (order_locked(l, join)) {
        ncclResult_t r = issue(l);
        rc = settle(nccl, r, Clock::now() + timeout, aborted, nullptr, &err);
      }
      if (rc == SP_OK && !l.error.empty()) {
        rc = SP_ERR_INTERNAL;
        err = l.error;
      }
      for (void* p : l.scratch) cudaFreeAsync(p, l.stream);
      if (rc == SP_OK) rc = record_locked(l.stream, &state->event, &err);
      if (rc != SP_OK) {
        if (rc == SP_ERR_TIMEOUT) {
          err += " (" + std::to_string(timeout.count()) + " ms); communicator aborted";
          abort_locked();
        }
        return fail(rc, what(op) + ": " + err);
      }
      state->issued = Clock::now();
    }
    return hand_out(state, work);
  }

  // Holds a send/recv back until the next launch (see the top of the file).
  int post(bool is_send, const sp_buffer& buf, int peer, ncclDataType_t dt, sp_work** work) {
    const char* op = is_send ? "send" : "recv";
    auto state = std::make_shared<WorkState>(shared_from_this(), op);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted || !nccl) return fail(SP_ERR_ABORTED, what(op) + ": the communicator was aborted");
      state->pending = true;
      pending_.push_back(P2P{is_send, buf.data, buf.count, dt, peer,
                             buf.stream ? static_cast<cudaStream_t>(buf.stream) : stream, state});
      if (!work) {
        DeviceGuard g(device);
        flush_locked();
      }
    }
    return hand_out(state, work);
  }

  // A collective over this communicator: ncclCommSplit where NCCL has it,
  // else new unique ids exchanged through the store.
  int split(int32_t color, int32_t key, std::shared_ptr<Comm>* out, std::string* err) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted || !nccl) {
      *err = "the communicator was aborted";
      return SP_ERR_ABORTED;
    }
    DeviceGuard g(device);
    flush_locked();
    const uint32_t seq = split_seq_++;
    const std::string child_prefix = prefix + "/split/" + std::to_string(seq) + "/" + std::to_string(color);
#if SP_NCCL_HAS_COMM_SPLIT
    if (!split_via_store) {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ncclComm_t child = nullptr;
      ncclResult_t r = ncclCommSplit(nccl, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
      int rc = settle_split(r, color >= 0, &child, Clock::now() + timeout, err);
      if (rc != SP_OK) {
        *err = "ncclCommSplit: " + *err;
        if (child) ncclCommAbort(child);
        if (rc == SP_ERR_TIMEOUT) {
          *err += " (" + std::to_string(timeout.count()) + " ms); communicator aborted";
          abort_locked();
        }
        return rc;
      }
      if (!child) return SP_OK;
      int child_rank = 0, child_size = 0;
      ncclCommUserRank(child, &child_rank);
      ncclCommCount(child, &child_size);
      auto c = std::make_shared<Comm>(child_rank, child_size, device, timeout, store, child_prefix, split_via_store);
      if (int crc = c->init(nullptr, child, &aborted, err)) return crc;
      *out = std::move(c);
      return SP_OK;
    }
#endif
    return split_through_store(seq, color, key, child_prefix, out, err);
  }

  // A nonblocking ncclCommSplit hands the new communicator over from NCCL's
  // own thread: `*child` stays NULL until the split is complete, and the
  // parent's state alone does not tell when (seen on an H200 with NCCL
  // 2.28.3: the parent read ready while `*child` was still NULL, and the next
  // call on the parent failed as still in progress;
  // tests/comm_nccl/mock_cuda_nccl.cpp plays this back). So this waits for
  // both: the parent no longer in progress and, for a rank with a color, the
  // child handed over and itself ready.
  int settle_split(ncclResult_t r, bool want_child, ncclComm_t* child, Clock::time_point deadline,
                   std::string* err) {
    Backoff backoff;
    while (true) {
      if (r != ncclSuccess && r != ncclInProgress) {
        *err = nccl_msg(nccl, r);
        return status_of(r);
      }
      // The child first: the parent's "ready" counts only once it was read
      // after the hand-over.
      ncclComm_t c = __atomic_load_n(child, __ATOMIC_ACQUIRE);
      ncclResult_t parent = ncclSuccess;
      ncclResult_t q = ncclCommGetAsyncError(nccl, &parent);
      if (q != ncclSuccess) parent = q;
      if (parent != ncclSuccess && parent != ncclInProgress) {
        *err = nccl_msg(nccl, parent);
        return status_of(parent);
      }
      ncclResult_t mine = want_child ? ncclInProgress : ncclSuccess;
      if (c) {
        q = ncclCommGetAsyncError(c, &mine);
        if (q != ncclSuccess) mine = q;
        if (mine != ncclSuccess && mine != ncclInProgress) {
          *err = nccl_msg(c, mine);
          return status_of(mine);
        }
      }
      if (parent == ncclSuccess && mine == ncclSuccess) return SP_OK;
      if (aborted) {
        *err = "the communicator was aborted";
        return SP_ERR_ABORTED;
      }
      if (Clock::now() > deadline) {
        *err = std::string("NCCL did not finish the split within the communicator's timeout (parent ") +
               (parent == ncclInProgress ? "in progress" : "ready") + ", new communicator " +
               (c ? (mine == ncclInProgress ? "in progress" : "ready") : "not handed over") + ")";
        return SP_ERR_TIMEOUT;
      }
      backoff.pause();
      r = ncclSuccess;
    }
  }

  void abort() {
    // Before the lock: whoever holds it is polling NCCL and gives up on this.
    aborted = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      abort_locked();
    }
    children.abort_all();
  }

  shardplan::comm::Children<Comm> children;

  // The end of the communicator for its owner; works still held stay valid.
  void destroy() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& p : pending_)
      p.state->finish(SP_ERR_ABORTED, "the communicator was destroyed before this operation was launched");
    pending_.clear();
    if (!nccl) return;
    DeviceGuard g(device);
    // Finalize completes what was issued; it only hangs on a peer that is
    // gone, and then abort is the only way out.
    std::string err;
    int rc = settle(nccl, ncclCommFinalize(nccl), Clock::now() + timeout, aborted, nullptr, &err);
    if (rc == SP_OK) ncclCommDestroy(nccl);
    else ncclCommAbort(nccl);
    nccl = nullptr;
  }

  // One look at `st`; true when it has finished (its status is then final).
  bool poll(WorkState& st) {
    std::lock_guard<std::mutex> lock(mu_);
    if (st.done) return true;
    DeviceGuard g(device);
    if (st.pending) flush_locked();
    if (st.done) return true;
    if (aborted) {
      st.finish(SP_ERR_ABORTED, "the communicator was aborted");
      return true;
    }
    cudaError_t q = cudaEventQuery(st.event->ev);
    if (q == cudaSuccess) {
      st.finish(SP_OK, {});
      return true;
    }
    if (q != cudaErrorNotReady) {
      st.finish(SP_ERR_INTERNAL, "CUDA reports " + cuda_msg(q));
      return true;
    }
    ncclResult_t async = ncclSuccess;
    if (nccl && ncclCommGetAsyncError(nccl, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      st.finish(SP_ERR_INTERNAL, nccl_msg(nccl, async) + "; communicator aborted");
      abort_locked();
      return true;
    }
    // NCCL kernels cannot be cancelled one by one: past the communicator's
    // timeout the only way to free the GPU is to abort the communicator.
    if (Clock::now() - st.issued > timeout) {
      st.finish(SP_ERR_TIMEOUT, "not finished " + std::to_string(timeout.count()) +
                                    " ms after it was issued (the communicator's timeout); communicator aborted");
      abort_locked();
      return true;
    }
    return false;
  }

 private:
  struct P2P {
    bool is_send;
    void* data;
    uint64_t count;
    ncclDataType_t dt;
    int peer;
    cudaStream_t stream;
    std::shared_ptr<WorkState> state;
  };

  int hand_out(const std::shared_ptr<WorkState>& state, sp_work** work);

  // Makes l.stream wait for the previous operation (when it ran on another
  // stream) and for `join`. False with l.error set on a CUDA failure.
  bool order_locked(Launch& l, cudaStream_t join) {
    if (last_ && last_stream_ != l.stream &&
        !l.cuda(cudaStreamWaitEvent(l.stream, last_->ev, 0), "cudaStreamWaitEvent"))
      return false;
    if (join && join != l.stream) {
      cudaEvent_t ev = nullptr;
      bool ok = l.cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate") &&
                l.cuda(cudaEventRecord(ev, join), "cudaEventRecord") &&
                l.cuda(cudaStreamWaitEvent(l.stream, ev, 0), "cudaStreamWaitEvent");
      if (ev) cudaEventDestroy(ev);  // the wait is already enqueued
      return ok;
    }
    return true;
  }

  int record_locked(cudaStream_t s, std::shared_ptr<Event>* out, std::string* err) {
    auto ev = std::make_shared<Event>(device);
    cudaError_t e = cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev->ev, s);
    if (e != cudaSuccess) {
      *err = "cannot record a CUDA event: " + cuda_msg(e);
      return SP_ERR_INTERNAL;
    }
    last_ = ev;
    last_stream_ = s;
    *out = std::move(ev);
    return SP_OK;
  }

  // Launches the held-back send/recvs as one group on the first one's stream
  // (the others' streams are joined before and wait for it after).
  void flush_locked() {
    if (pending_.empty()) return;
    std::vector<P2P> ops;
    ops.swap(pending_);
    int rc = SP_OK;
    std::string err;
    std::shared_ptr<Event> ev;
    if (aborted || !nccl) {
      rc = SP_ERR_ABORTED;
      err = "the communicator was aborted";
    } else {
      Launch l;
      l.stream = ops.front().stream;
      std::vector<cudaStream_t> others;
      for (const auto& p : ops)
        if (p.stream != l.stream && std::find(others.begin(), others.end(), p.stream) == others.end())
          others.push_back(p.stream);
      bool ok = order_locked(l, nullptr);
      for (size_t i = 0; ok && i < others.size(); ++i) ok = order_locked(l, others[i]);
      if (ok) {
        ncclResult_t r = grouped([&] {
          for (const auto& p : ops) {
            if (p.count == 0) continue;
            ncclResult_t x = p.is_send ? ncclSend(p.data, p.count, p.dt, p.peer, nccl, l.stream)
                                       : ncclRecv(p.data, p.count, p.dt, p.peer, nccl, l.stream);
            if (x != ncclSuccess) return x;
          }
          return ncclSuccess;
        });
        rc = settle(nccl, r, Clock::now() + timeout, aborted, nullptr, &err);
      } else {
        rc = SP_ERR_INTERNAL;
        err = l.error;
      }
      if (rc == SP_OK) rc = record_locked(l.stream, &ev, &err);
      for (cudaStream_t s : others)
        if (rc == SP_OK && !l.cuda(cudaStreamWaitEvent(s, ev->ev, 0), "cudaStreamWaitEvent")) {
          rc = SP_ERR_INTERNAL;
          err = l.error;
        }
      if (rc == SP_ERR_TIMEOUT) {
        err += " (" + std::to_string(timeout.count()) + " ms); communicator aborted";
        abort_locked();
      }
    }
    const auto now = Clock::now();
    for (auto& p : ops) {
      p.state->pending = false;
      if (rc == SP_OK) {
        p.state->event = ev;
        p.state->issued = now;
      } else {
        p.state->finish(rc, err);
      }
    }
  }

  void abort_locked() {
    aborted = true;
    for (auto& p : pending_) p.state->finish(SP_ERR_ABORTED, "the communicator was aborted");
    pending_.clear();
    if (nccl) {
      DeviceGuard g(device);
      ncclCommAbort(nccl);
      nccl = nullptr;
    }
  }

  int split_through_store(uint32_t seq, int32_t color, int32_t key, const std::string& child_prefix,
                          std::shared_ptr<Comm>* out, std::string* err) {
    std::vector<std::pair<int32_t, int>> members;  // (key, parent rank) of our color
    if (size == 1) {
      if (color >= 0) members.emplace_back(key, 0);
    } else {
      if (!store) {
        *err = "split through the store, but this communicator has none";
        return SP_ERR_INVALID;
      }
      const std::string base = prefix + "/split/" + std::to_string(seq) + "/";
      const int32_t mine[2] = {color, key};
      if (int rc = store->set(base + std::to_string(rank), mine, sizeof mine, err)) return rc;
      for (int r = 0; r < size; ++r) {
        std::vector<char> v;
        if (int rc = store->get(base + std::to_string(r), &v, timeout, &aborted, err)) return rc;
        int32_t theirs[2];
        if (v.size() != sizeof theirs) {
          *err = "malformed split record of rank " + std::to_string(r);
          return SP_ERR_INTERNAL;
        }
        std::memcpy(theirs, v.data(), sizeof theirs);
        if (color >= 0 && theirs[0] == color) members.emplace_back(theirs[1], r);
      }
    }
    if (color < 0) return SP_OK;
    std::sort(members.begin(), members.end());
    int new_rank = 0;
    while (members[new_rank].second != rank) ++new_rank;
    ncclUniqueId id;
    if (new_rank == 0) {
      ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) {
        *err = "ncclGetUniqueId: " + nccl_msg(nullptr, r);
        return status_of(r);
      }
      if (members.size() > 1)
        if (int rc = publish_id(*store, child_prefix + "/id", id, err)) return rc;
    } else if (int rc = fetch_id(*store, child_prefix + "/id", timeout, &aborted, &id, err)) {
      return rc;
    }
    auto c = std::make_shared<Comm>(new_rank, static_cast<int>(members.size()), device, timeout, store, child_prefix,
                                    split_via_store);
    if (int rc = c->init(&id, nullptr, &aborted, err)) return rc;
    *out = std::move(c);
    return SP_OK;
  }

  std::mutex mu_;  // held only for short, nonblocking NCCL and CUDA calls
  ncclComm_t nccl = nullptr;
  cudaStream_t stream = nullptr;  // the communicator's own
  void* scalar = nullptr;         // the barrier's one element
  std::shared_ptr<Event> last_;   // completion of the latest launch
  cudaStream_t last_stream_ = nullptr;
  std::vector<P2P> pending_;
  uint32_t split_seq_ = 0;
};

namespace {

int report(const WorkState& st) {
  if (st.status != SP_OK) shardplan::comm::last_error() = st.comm->what(st.op) + ": " + st.error;
  return st.status;
}

// timeout_ms < 0: until done, bounded by the communicator's own timeout
// (poll() aborts past it).
int wait_state(WorkState& st, int64_t timeout_ms) {
  const auto deadline = timeout_ms >= 0 ? Clock::now() + ms(timeout_ms) : Clock::time_point::max();
  Backoff backoff;
  while (!st.comm->poll(st)) {
    if (Clock::now() >= deadline)
      return fail(SP_ERR_TIMEOUT, st.comm->what(st.op) + ": not finished after " + std::to_string(timeout_ms) + " ms");
    backoff.pause();
  }
  return report(st);
}

}  // namespace

int Comm::hand_out(const std::shared_ptr<WorkState>& state, sp_work** work) {
  if (work) {
    *work = new sp_work{state};
    return SP_OK;
  }
  return wait_state(*state, -1);
}

namespace {

// ------------------------------------------------------------ validation

int check_comm(const char* op, sp_comm* comm) {
  if (!comm || !comm->impl) return fail(SP_ERR_INVALID, std::string("nccl ") + op + ": NULL communicator");
  if (comm->impl->aborted)
    return fail(SP_ERR_ABORTED, comm->impl->what(op) + ": the communicator was aborted");
  return SP_OK;
}

int check_buffer(const Comm& c, const char* op, const char* which, const sp_buffer* b) {
  auto context = [&] { return c.what(op); };
  if (int rc = shardplan::comm::check_device_buffer(
          SP_DEVICE_CUDA, "is a CPU buffer; the nccl backend moves CUDA device memory only (use gloo for CPU)", which, b,
          context))
    return rc;
  if (b->device_index != c.device)
    return fail(SP_ERR_INVALID, context() + ": " + which + " is on cuda:" + std::to_string(b->device_index) +
                                    " but this communicator uses cuda:" + std::to_string(c.device));
  return SP_OK;
}

int check_pair(const Comm& c, const char* op, const sp_buffer* send, const sp_buffer* recv) {
  int rc = check_buffer(c, op, "send", send);
  if (rc == SP_OK) rc = check_buffer(c, op, "recv", recv);
  if (rc == SP_OK && send->dtype != recv->dtype)
    rc = fail(SP_ERR_INVALID, c.what(op) + ": send is " + dtype_name(send->dtype) + " but recv is " +
                                  dtype_name(recv->dtype));
  return rc;
}

int count_mismatch(const Comm& c, const char* op, const std::string& what) {
  return fail(SP_ERR_INVALID, c.what(op) + ": " + what);
}

int check_root(const Comm& c, const char* op, int32_t root) {
  if (root < 0 || root >= c.size)
    return fail(SP_ERR_INVALID, c.what(op) + ": root " + std::to_string(root) + " is outside the group of " +
                                    std::to_string(c.size));
  return SP_OK;
}

ncclDataType_t dt_of(const sp_buffer& b) {
  ncclDataType_t t = ncclFloat32;
  nccl_dtype(b.dtype, &t);  // validated before
  return t;
}

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
