// Communication plugin over gloo (CPU, TCP transport). Torch-free: only the
// C ABI headers and gloo.
//
// Every collective of one communicator runs on one thread at a time, in issue
// order: inline on the caller when nothing is queued, else on the
// communicator's worker thread. Collective tags come from a per-communicator
// counter advanced by that executing thread, so all ranks agree on them
// without talking. Point-to-point operations are posted at issue time and only
// their completion is queued: gloo's TCP send waits for the matching receive,
// so posting them in order from the queue would deadlock an isend/irecv
// exchange between two ranks. Messages to oneself (gloo has no pair to self)
// go through an in-process mailbox.
//
// The pieces: comm.h (a communicator and its queue), context.h (aborting a
// gloo context), self_mailbox.h (messages to oneself), run_gloo.h (gloo's
// collectives on our buffers), validation.h (argument checks), errors.h
// (statuses, SIGPIPE), reduce.h (reductions), rendezvous.h (stores),
// tcp_all_reduce.h (all_reduce of 2 ranks over TCP).
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/rendezvous/context.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm.h"
#include "env.h"
#include "errors.h"
#include "link.h"
#include "reduce.h"
#include "rendezvous.h"
#include "run_gloo.h"
#include "self_mailbox.h"
#include "shardplan/abi/comm.h"
#include "shardplan/abi/plugin.h"
#include "shardplan/comm_dtype.h"
#include "shardplan/comm_plugin.h"
#include "tcp_all_reduce.h"
#include "validation.h"

namespace sp_gloo {
namespace {

using shardplan::comm::dtype_size;
using shardplan::comm::fail;
using shardplan::comm::overlaps;

// Slot prefixes of our own algorithms; gloo's collectives use 0x01..0x08.
constexpr uint8_t kReduceScatterSlotPrefix = 0x21;
constexpr uint8_t kPointToPointSlotPrefix = 0x22;

// ---------------------------------------------------------------- create

struct Options {
  std::string local_addr;
  std::string iface;
  std::string file_store;
  std::string prefix;
  bool blocking_inline = false;  // blocking=inline|worker
  ShmMode shm = ShmMode::kAuto;  // shm=auto|on|off
  TcpAllReduce tcp_all_reduce = TcpAllReduce::kAuto;  // tcp_all_reduce=auto|ring
  double link_gbps = 0;          // link_gbps=X
  long spin_us = kSpinAuto;      // spin_us=N
  long test_stall_ms = 0;        // SHARDPLAN_TEST_GLOO_STALL_MS
  bool verbose = false;          // SHARDPLAN_GLOO_VERBOSE
  std::string bad;               // the first bad option or variable, as create() reports it
};

Options parse_options(const char* const* options) {
  Options o;
  const EnvDefaults env = env_defaults();
  o.shm = env.shm;
  o.tcp_all_reduce = env.tcp_all_reduce;
  o.link_gbps = env.link_gbps;
  o.spin_us = env.spin_us;
  o.test_stall_ms = env.test_stall_ms;
  o.verbose = env.verbose;
  o.bad = env.bad;
  auto refuse = [&](const std::string& what) {
    if (o.bad.empty()) o.bad = "bad option " + what;
  };
  shardplan::comm::for_each_option(options, [&](const std::string& k, const std::string& v) {
    if (k == "local_addr") o.local_addr = v;
    else if (k == "iface") o.iface = v;
    else if (k == "file_store") o.file_store = v;
    else if (k == "prefix") o.prefix = v;
    else if (k == "blocking" && (v == "inline" || v == "worker")) o.blocking_inline = v == "inline";
    else if (k == "blocking") refuse("blocking=" + v + " (expected blocking=worker or blocking=inline)");
    else if (k == "shm" && !parse_shm_mode(v, o.shm)) refuse("shm=" + v + " (expected shm=auto, shm=on or shm=off)");
    else if (k == "tcp_all_reduce" && !parse_tcp_all_reduce(v, o.tcp_all_reduce))
      refuse("tcp_all_reduce=" + v + " (expected tcp_all_reduce=auto or tcp_all_reduce=ring)");
    else if (k == "link_gbps" && !parse_link_gbps(v, o.link_gbps))
      refuse("link_gbps=" + v + " (expected a number of Gbit/s > 0, or 0 for no emulated link)");
    else if (k == "spin_us" && !parse_spin_us(v, o.spin_us))
      refuse("spin_us=" + v + " (expected a number of microseconds from 0 to 1000000)");
  });
  return o;
}

// Every rank's address, for the errors of this communicator and its splits
// (Comm::other_hosts): one all-gather of 64 bytes a rank, once per world.
void gather_hosts(Comm& c, const std::string& mine) {
  constexpr size_t kLen = 64;
  c.root_ranks.resize(static_cast<size_t>(c.size));
  for (int r = 0; r < c.size; ++r) c.root_ranks[static_cast<size_t>(r)] = r;
  std::vector<char> in(kLen, '\0'), all(kLen * static_cast<size_t>(c.size), '\0');
  std::copy_n(mine.begin(), std::min(mine.size(), kLen - 1), in.begin());
  if (c.size > 1)
    run_gloo(c, gloo::allgather, [&](auto& o) {
      o.setInput(in.data(), kLen);
      o.setOutput(all.data(), all.size());
    });
  else
    all = in;
  auto hosts = std::make_shared<std::vector<std::string>>();
  for (int r = 0; r < c.size; ++r) hosts->emplace_back(all.data() + kLen * static_cast<size_t>(r));
  c.hosts = std::move(hosts);
}

// A waiting rank polls (kDefaultSpinUs) only while this host has a core for
// each of its ranks: with more ranks than cores, a poller takes turns from
// ranks that still compute (Open MPI yields when oversubscribed alike).
// Ranks count as on this host when they gave the same address.
long default_spin_us(const Comm& c) {
  if (!c.hosts || c.hosts->empty()) return 0;
  const std::string& mine = c.hosts->at(static_cast<size_t>(c.rank));
  const long here = std::count(c.hosts->begin(), c.hosts->end(), mine);
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return cores > 0 && here <= cores ? kDefaultSpinUs : 0;
}

// SHARDPLAN_GLOO_VERBOSE=1: which transport a communicator's collectives
// take, so a test (or a user on a cluster) can see that ranks of one host
// share memory and the others cross the network, which timings alone cannot
// tell apart on a fast link. One line on stderr per communicator and rank.
void log_transport(const Comm& c) {
  if (!c.verbose) return;
  std::string ranks, hosts;
  for (size_t m = 0; m < c.root_ranks.size(); ++m) {
    const int r = c.root_ranks[m];
    ranks += (m ? "," : "") + std::to_string(r);
    const std::string& h = c.hosts && static_cast<size_t>(r) < c.hosts->size() ? c.hosts->at(static_cast<size_t>(r)) : "?";
    if (hosts.find(h) == std::string::npos) hosts += (hosts.empty() ? "" : ", ") + h;
  }
  // One write, so that lines of ranks sharing a terminal do not interleave.
  const std::string line = "gloo: rank " + std::to_string(c.rank) + " of " + std::to_string(c.size) + " (world ranks " +
                           ranks + "): " + (c.shm ? "shared memory" : "tcp, hosts " + hosts) + "\n";
  std::fputs(line.c_str(), stderr);
}

int api_create(const sp_comm_config* config, sp_comm** out) {
  if (int rc = shardplan::comm::check_create("gloo", config, out)) return rc;
  const int rank = config->rank, size = config->world_size;
  const ms timeout = shardplan::comm::timeout_of(*config);
  Options opt = parse_options(config->options);
  const std::string op = "create (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")";
  const std::string who = "gloo " + op;

  return guarded(op.c_str(), [&]() -> int {
    if (!opt.bad.empty()) return fail(SP_ERR_INVALID, who + ": " + opt.bad);
    std::shared_ptr<KeyStore> store;
    if (config->store) store = std::make_shared<HostStore>(*config->store, timeout);
    else if (!opt.file_store.empty()) store = std::make_shared<DirStore>(opt.file_store, timeout);
    else if (size == 1) store = std::make_shared<SoloStore>(timeout);
    else return fail(SP_ERR_INVALID, who + ": no rendezvous: pass a store or the option file_store=<dir>");

    gloo::transport::tcp::attr attr;
    if (!opt.iface.empty()) attr.iface = opt.iface;
    else attr.hostname = opt.local_addr.empty() ? "127.0.0.1" : opt.local_addr;
    std::shared_ptr<gloo::transport::Device> device;
    try {
      device = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      return fail(SP_ERR_INVALID, who + ": cannot listen on " + (opt.iface.empty() ? attr.hostname : opt.iface) +
                                      ": " + clean(e.what()));
    }

    // A store may outlive one world (tests create several in a row); each
    // rank counts its own earlier worlds on it, and all ranks count alike.
    std::string prefix = opt.prefix;
    if (prefix.empty()) {
      int gen = 0;
      auto key = [&](int g) { return "gloo/gen/" + std::to_string(g) + "/" + std::to_string(rank); };
      while (store->check(key(gen))) ++gen;
      store->set(key(gen), {'1'});
      prefix = "gloo/" + std::to_string(gen);
    }

    auto comm = std::make_shared<Comm>(rank, size, timeout, store, prefix, device, opt.blocking_inline);
    comm->shm_mode = opt.shm;
    comm->tcp_all_reduce = opt.tcp_all_reduce;
    comm->link_bytes_per_second = opt.link_gbps * 1e9 / 8;
    comm->test_stall_ms = opt.test_stall_ms;
    comm->verbose = opt.verbose;
    comm->connect();
    gather_hosts(*comm, opt.iface.empty() ? attr.hostname : "interface " + opt.iface);
    comm->set_spin_wait(std::chrono::microseconds(opt.spin_us == kSpinAuto ? default_spin_us(*comm) : opt.spin_us));
    attach_shm(*comm, comm->shm_mode);
    log_transport(*comm);
    *out = new sp_comm{comm};
    return SP_OK;
  });
}

// ----------------------------------------------------------------- split

int api_split(sp_comm* parent, int32_t color, int32_t key, sp_comm** out) {
  if (!out) return fail(SP_ERR_INVALID, "gloo split: out is NULL");
  *out = nullptr;
  if (int rc = check_comm("split", parent)) return rc;
  SigpipeBlock no_sigpipe;
  Comm* p = parent->impl.get();
  std::shared_ptr<Comm> child;
  int rc = p->submit(
      "split",
      [&] {
        int32_t mine[2] = {color, key};
        std::vector<int32_t> all(2 * static_cast<size_t>(p->size));
        run_gloo(*p, gloo::allgather, [&](auto& o) {
          o.setInput(mine, 2);
          o.setOutput(all.data(), all.size());
        });
        uint32_t seq = p->split_seq++;
        if (color < 0) return;

        std::vector<std::pair<int32_t, int>> members;  // (key, parent rank)
        for (int r = 0; r < p->size; ++r)
          if (all[2 * r] == color) members.emplace_back(all[2 * r + 1], r);
        std::sort(members.begin(), members.end());
        int new_rank = 0;
        while (members[new_rank].second != p->rank) ++new_rank;

        auto c = std::make_shared<Comm>(new_rank, static_cast<int>(members.size()), p->timeout, p->store,
                                        p->prefix + "/split/" + std::to_string(seq) + "/" + std::to_string(color),
                                        p->device, p->blocking_inline());
        c->shm_mode = p->shm_mode;
        c->tcp_all_reduce = p->tcp_all_reduce;
        c->link_bytes_per_second = p->link_bytes_per_second;
        c->set_spin_wait(p->spin_wait());
        c->test_stall_ms = p->test_stall_ms;
        c->verbose = p->verbose;
        c->hosts = p->hosts;
        for (const auto& m : members) c->root_ranks.push_back(p->root_ranks.at(static_cast<size_t>(m.second)));
        c->connect(&p->aborted);
        attach_shm(*c, c->shm_mode);
        log_transport(*c);
        child = std::move(c);
      },
      nullptr);
  if (rc != SP_OK) return rc;
  if (child) {
    p->children.adopt(child, p->aborted);
    *out = new sp_comm{child};
  }
  return SP_OK;
}

int api_abort(sp_comm* comm) {
  if (!comm || !comm->impl) return fail(SP_ERR_INVALID, "gloo abort: NULL communicator");
  SigpipeBlock no_sigpipe;
  try {
    comm->impl->abort();
  } catch (const std::exception& e) {
    return fail(SP_ERR_INTERNAL, std::string("gloo abort: ") + clean(e.what()));
  }
  return SP_OK;
}

// A worker stuck in an operation a wait gave up on (comm.h, WorkerWatch)
// would be joined forever, and could wake to use a freed communicator: such a
// communicator is kept, reachable, for the life of the process, whose exit
// ends the thread.
void keep_forever(std::shared_ptr<Comm> c) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::shared_ptr<Comm>>;
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::move(c));
}

void api_destroy(sp_comm* comm) {
  SigpipeBlock no_sigpipe;
  try {
    if (comm && comm->impl && comm->impl->worker_stuck()) keep_forever(std::move(comm->impl));
    delete comm;
  } catch (...) {
  }
}

int32_t api_rank(const sp_comm* comm) { return comm && comm->impl ? comm->impl->rank : -1; }
int32_t api_size(const sp_comm* comm) { return comm && comm->impl ? comm->impl->size : -1; }

// ----------------------------------------------------------- collectives

// Queues a collective whose arguments are valid: `run(c, s, r, es)` executes
// in issue order with copies of the descriptors (an async call's need not
// outlive the call) and their element size, and not at all when there are no
// elements to move.
template <typename Run>
int submit_collective(Comm* c, const char* name, const sp_buffer& send, const sp_buffer& recv, sp_work** work,
                      Run run) {
  const size_t es = dtype_size(recv.dtype);
  const double link_s =
      link_seconds(c->link_bytes_per_second, name, c->size, double(send.count * es), double(recv.count * es));
  const std::string too_slow = link_refusal(link_s, c->link_bytes_per_second, c->timeout);
  if (!too_slow.empty()) return fail(SP_ERR_TIMEOUT, "gloo " + c->what(name) + ": " + too_slow);
  return c->submit(
      name,
      [c, s = send, r = recv, es, run, link_s] {
        c->test_stall();
        const LinkPace pace(link_s, c->aborted);
        if (r.count > 0) run(*c, s, r, es);
      },
      work);
}

// all_gather and all_to_all: every rank passes both buffers.
template <typename Run>
int paired_collective(const char* op, sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, Counts counts,
                      sp_work** work, Run run) {
  return on_comm(op, comm, [&](const char* name, Comm* c) -> int {
    if (int rc = check_pair(name, send, recv, counts, c->size)) return rc;
    return submit_collective(c, name, *send, *recv, work, run);
  });
}

// all_reduce and reduce_scatter: paired collectives whose `run` also gets the
// reduction for the buffers' dtype, last.
template <typename Run>
int reduction_collective(const char* op, sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, Counts counts,
                         int32_t reduce_op, sp_work** work, Run run) {
  return on_comm(op, comm, [&](const char* name, Comm* c) -> int {
    ReduceFn fn = nullptr;
    if (int rc = check_reduction(name, send, recv, counts, reduce_op, c->size, fn)) return rc;
    auto run_with_fn = [fn, run](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es) { run(c, s, r, es, fn); };
    return submit_collective(c, name, *send, *recv, work, run_with_fn);
  });
}

// broadcast, scatter and gather. A rank other than the root passes only the
// buffer it uses (`others_use`), which then stands in for the other one.
// `run` gets whether this rank is the root, last.
template <typename Run>
int rooted_collective(const char* op, sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root,
                      Counts counts, Side others_use, sp_work** work, Run run) {
  return on_comm(op, comm, [&](const char* name, Comm* c) -> int {
    if (int rc = check_rooted(name, *c, root, send, recv, counts, others_use)) return rc;
    const bool is_root = c->rank == root;
    const sp_buffer& mine = others_use == Side::kSend ? *send : *recv;
    auto run_as = [is_root, run](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es) {
      run(c, s, r, es, is_root);
    };
    return submit_collective(c, name, is_root ? *send : mine, is_root ? *recv : mine, work, run_as);
  });
}

int api_all_reduce(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t op, sp_work** work) {
  return reduction_collective(
      "all_reduce", comm, send, recv, Counts::kEqual, op, work,
      [](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es, ReduceFn fn) {
        // Copying first and reducing in place costs what gloo's own
        // out-of-place path costs (it copies per segment) and survives
        // any overlap of send and recv.
        if (c.shm) return c.shm->all_reduce(bytes(s), bytes(r), r.count, es, fn);
        if (takes_pairwise_all_reduce(c.tcp_all_reduce, c.size, r.count * es))
          return pairwise_all_reduce(c, s, r, es, fn);
        if (s.data != r.data) std::memmove(r.data, s.data, r.count * es);
        run_gloo(c, es, gloo::allreduce, [&](auto& o, auto e) {
          o.setOutput(static_cast<decltype(e)*>(r.data), r.count);
          o.setReduceFunction(fn);
        });
      });
}

int api_all_gather(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, sp_work** work) {
  return paired_collective(
      "all_gather", comm, send, recv, Counts::kRecvPerRank, work,
      [](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es) {
        if (c.shm) return c.shm->all_gather(bytes(s), bytes(r), s.count, es);
        size_t chunk = s.count * es;
        uint8_t* mine = bytes(r, chunk * c.rank);
        if (s.data != mine) std::memmove(mine, s.data, chunk);
        run_gloo(c, es, gloo::allgather, [&](auto& o, auto e) {
          o.setOutput(static_cast<decltype(e)*>(r.data), r.count);
        });
      });
}

// Ring reduce-scatter: in step s this rank sends the partial sum of chunk
// (rank - s - 1) to the right and receives chunk (rank - s - 2) from the
// left, which it reduces with its own copy of that chunk. After size - 1
// steps the chunk received last is this rank's, fully reduced. recv is only
// written in the last step, when send is no longer read except for this
// rank's own chunk, so recv == send works as in-place.
void ring_reduce_scatter(Comm& c, const sp_buffer& s, const sp_buffer& r, ReduceFn fn, size_t es) {
  const size_t n = r.count, chunk = n * es;
  const int P = c.size, me = c.rank;
  if (P == 1) {
    std::memmove(r.data, s.data, chunk);
    return;
  }
  uint8_t* const own = bytes(s, chunk * me);
  const StableInput own_chunk(own, chunk,
                              r.data != s.data && r.data != own && overlaps(r.data, chunk, s.data, chunk * P));
  auto chunk_of = [&](int i) -> const uint8_t* { return i == me ? own_chunk.data() : bytes(s, chunk * i); };

  const auto slot = gloo::Slot::build(kReduceScatterSlotPrefix, c.next_tag());
  const int right = (me + 1) % P, left = (me + P - 1) % P;
  std::vector<uint8_t> incoming(chunk), partial(chunk);
  auto in_buf = c.ctx->createUnboundBuffer(incoming.data(), chunk);
  auto partial_buf = c.ctx->createUnboundBuffer(partial.data(), chunk);
  auto send_buf = c.ctx->createUnboundBuffer(s.data, chunk * P);
  for (int step = 0; step < P - 1; ++step) {
    in_buf->recv(left, slot, 0, chunk);
    auto& out_buf = step == 0 ? send_buf : partial_buf;
    out_buf->send(right, slot, step == 0 ? chunk * ((me + P - 1) % P) : 0, chunk);
    in_buf->waitRecv(c.timeout);
    out_buf->waitSend(c.timeout);
    const int idx = ((me - step - 2) % P + P) % P;
    void* dst = step == P - 2 ? r.data : partial.data();
    fn(dst, incoming.data(), chunk_of(idx), n);
  }
}

int api_reduce_scatter(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t op, sp_work** work) {
  return reduction_collective(
      "reduce_scatter", comm, send, recv, Counts::kSendPerRank, op, work,
      [](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es, ReduceFn fn) {
        if (c.shm) return c.shm->reduce_scatter(bytes(s), bytes(r), r.count, es, fn);
        ring_reduce_scatter(c, s, r, fn, es);
      });
}

int api_broadcast(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work) {
  return rooted_collective(
      "broadcast", comm, send, recv, root, Counts::kEqual, Side::kRecv, work,
      [root](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es, bool is_root) {
        if (is_root && s.data != r.data) std::memmove(r.data, s.data, r.count * es);
        run_gloo(c, es, root, gloo::broadcast, [&](auto& o, auto e) {
          o.setOutput(static_cast<decltype(e)*>(r.data), r.count);
        });
      });
}

int api_scatter(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work) {
  return rooted_collective(
      "scatter", comm, send, recv, root, Counts::kSendPerRank, Side::kRecv, work,
      [root](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es, bool is_root) {
        const size_t chunk = r.count * es;
        // The root's sends are still in flight when gloo copies its own block
        // into recv.
        const StableInput src(bytes(s), chunk * c.size, is_root && overlaps_other_blocks(r.data, s, chunk, c, root));
        run_gloo(c, es, root, gloo::scatter, [&](auto& o, auto e) {
          using E = decltype(e);
          if (is_root) {
            std::vector<E*> blocks;
            for (int i = 0; i < c.size; ++i) blocks.push_back(reinterpret_cast<E*>(src.data() + chunk * i));
            o.setInputs(blocks, r.count);
          }
          o.setOutput(static_cast<E*>(r.data), r.count);
        });
      });
}

int api_gather(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work) {
  return rooted_collective(
      "gather", comm, send, recv, root, Counts::kRecvPerRank, Side::kSend, work,
      [root](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es, bool is_root) {
        const size_t chunk = s.count * es;
        // Peers' blocks land in recv before gloo copies ours; an input
        // overlapping another rank's block must be read first.
        const StableInput src(bytes(s), chunk, is_root && overlaps_other_blocks(s.data, r, chunk, c, root));
        run_gloo(c, es, root, gloo::gather, [&](auto& o, auto e) {
          using E = decltype(e);
          o.setInput(reinterpret_cast<E*>(src.data()), s.count);
          if (is_root) o.setOutput(static_cast<E*>(r.data), r.count);
        });
      });
}

int api_all_to_all(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, sp_work** work) {
  return paired_collective(
      "all_to_all", comm, send, recv, Counts::kEqualPerRank, work,
      [](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es) {
        const size_t total = r.count * es;
        const StableInput src(bytes(s), total, overlaps(s.data, total, r.data, total));
        run_gloo(c, es, gloo::alltoall, [&](auto& o, auto e) {
          using E = decltype(e);
          o.setInput(reinterpret_cast<E*>(src.data()), s.count);
          o.setOutput(static_cast<E*>(r.data), r.count);
        });
      });
}

int point_to_point(bool is_send, sp_comm* comm, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work) {
  return on_comm(is_send ? "send" : "recv", comm, [&](const char* name, Comm* c) -> int {
    if (int rc = check_buffer(name, "buffer", buf)) return rc;
    if (peer < 0 || peer >= c->size)
      return fail(SP_ERR_INVALID, "gloo " + c->what(name) + ": peer " + std::to_string(peer) +
                                      " is outside the group of " + std::to_string(c->size));
    const size_t nbytes = buf->count * dtype_size(buf->dtype);
    if (peer == c->rank) {
      std::shared_ptr<SelfMailbox::Recv> r;
      if (is_send) c->self.send(static_cast<uint32_t>(tag), buf->data, nbytes);
      else r = c->self.post_recv(static_cast<uint32_t>(tag), buf->data, nbytes);
      return c->submit(
          name,
          [c, r] {
            if (r) c->self.wait(*r, c->timeout, c->aborted);
          },
          work);
    }
    // Refused before anything is posted, as a collective is before it is queued.
    const double link_s = link_seconds(c->link_bytes_per_second, name, c->size, double(nbytes), double(nbytes));
    const std::string too_slow = link_refusal(link_s, c->link_bytes_per_second, c->timeout);
    if (!too_slow.empty()) return fail(SP_ERR_TIMEOUT, "gloo " + c->what(name) + ": " + too_slow);
    std::shared_ptr<gloo::transport::UnboundBuffer> ub;
    if (nbytes > 0) {
      ub = c->ctx->createUnboundBuffer(buf->data, nbytes);
      const auto slot = gloo::Slot::build(kPointToPointSlotPrefix, static_cast<uint32_t>(tag));
      if (is_send) ub->send(peer, slot, 0, nbytes);
      else ub->recv(peer, slot, 0, nbytes);
    }
    ms timeout = c->timeout;
    if (!is_send && !work)
      return c->run_now(name, [c, ub, timeout, link_s] {
        if (!ub) return;
        const LinkPace pace(link_s, c->aborted);
        ub->waitRecv(timeout);
      });
    return c->submit(
        name,
        [c, ub, is_send, timeout, link_s] {
          if (!ub) return;
          const LinkPace pace(link_s, c->aborted);
          if (is_send) ub->waitSend(timeout);
          else ub->waitRecv(timeout);
        },
        work);
  });
}

int api_send(sp_comm* comm, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work) {
  return point_to_point(true, comm, buf, peer, tag, work);
}

int api_recv(sp_comm* comm, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work) {
  return point_to_point(false, comm, buf, peer, tag, work);
}

int api_barrier(sp_comm* comm, sp_work** work) {
  return on_comm("barrier", comm, [&](const char* name, Comm* c) -> int {
    return c->submit(name, [c] { run_gloo(*c, gloo::barrier, [](auto&) {}); }, work);
  });
}

// ------------------------------------------------------------------ work

// Every gloo operation gives up after the communicator's timeout by itself;
// wait()'s margin beyond that only guards against a transport that never answers.
int api_wait(sp_work* work, int64_t timeout_ms) {
  return shardplan::comm::wait_work("gloo", work, timeout_ms, "the transport");
}

int api_test(sp_work* work, int32_t* done) { return shardplan::comm::test_work("gloo", work, done); }

void api_release(sp_work* work) { shardplan::comm::release_work(work); }

}  // namespace
}  // namespace sp_gloo

SHARDPLAN_COMM_PLUGIN(sp_gloo, "gloo", SP_CAP_CPU | SP_CAP_THREAD_RANKS | SP_CAP_PROCESS_RANKS,
                      "shardplan gloo plugin 0.1 (gloo 0.5.0, TCP)")
