// The in-process communication backend: ranks are threads of one process and
// every collective works directly on the other ranks' buffers.
//
// Protocol of a collective (all of them, split included):
//   1. each rank validates its arguments locally and publishes its buffer
//      pointers, counts and any error in its own slot of the shared group;
//   2. entry barrier: the only step that waits for peers, so the only one that
//      can time out or see an abort;
//   3. every rank checks every slot (same collective, dtype, count, op, root;
//      nobody reported an error), so bad arguments on one rank fail the
//      collective on all ranks instead of leaving them waiting;
//   4. data phase: each rank does 1/n of the work, reading and writing other
//      ranks' buffers directly (all_reduce: rank r reduces chunk r of every
//      send buffer and writes it into chunk r of every recv buffer);
//   5. exit barrier, so nobody returns (and frees or reuses its buffers) while
//      a peer still touches them. It cannot fail: every rank that passed the
//      entry barrier reaches it after a bounded amount of work.
// In-place and overlapping buffers are handled per collective: where a rank's
// own recv overlaps data that peers read during the data phase, that rank
// either snapshots its send into private scratch before the entry barrier, or
// writes its result into scratch and copies it out after the exit barrier.
//
// Ordering and async: blocking calls run inline in the caller when nothing is
// queued (no thread hop: that is most of the small-message latency budget);
// otherwise operations go through one worker thread per communicator, in
// issue order. Sends are eager (copied when no receive is posted yet), so a
// send never waits for its receiver and rings of send-then-recv cannot
// deadlock. A receive starts when issued but may finish later; an operation
// counts as complete only once every receive issued before it has finished,
// which keeps "operations complete in the order they were issued" without
// making collectives wait for receives to start (that could deadlock against
// a peer that sends after the collective).
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels.h"
#include "shardplan/abi/comm.h"
#include "shardplan/abi/plugin.h"
#include "shardplan/comm_dtype.h"
#include "shardplan/comm_plugin.h"

namespace sp_local {
namespace {

using shardplan::comm::dtype_name;
using shardplan::comm::dtype_size;
using shardplan::comm::fail;
using shardplan::comm::last_error;
using shardplan::comm::overlaps;
using shardplan::comm::reduce_op_name;

using Clock = std::chrono::steady_clock;

enum Kind {
  K_ALL_REDUCE,
  K_ALL_GATHER,
  K_REDUCE_SCATTER,
  K_BROADCAST,
  K_SCATTER,
  K_GATHER,
  K_ALL_TO_ALL,
  K_BARRIER,
  K_SPLIT,
  K_SEND,
  K_RECV
};

const char* kind_name(int k) {
  switch (k) {
    case K_ALL_REDUCE: return "all_reduce";
    case K_ALL_GATHER: return "all_gather";
    case K_REDUCE_SCATTER: return "reduce_scatter";
    case K_BROADCAST: return "broadcast";
    case K_SCATTER: return "scatter";
    case K_GATHER: return "gather";
    case K_ALL_TO_ALL: return "all_to_all";
    case K_BARRIER: return "barrier";
    case K_SPLIT: return "split";
    case K_SEND: return "send";
    case K_RECV: return "recv";
    default: return "?";
  }
}

bool is_p2p(int k) { return k == K_SEND || k == K_RECV; }
bool has_op(int k) { return k == K_ALL_REDUCE || k == K_REDUCE_SCATTER; }
bool has_root(int k) { return k == K_BROADCAST || k == K_SCATTER || k == K_GATHER; }

std::string ms_str(int64_t ms) { return std::to_string(ms) + " ms"; }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Waiting for a peer: spin briefly (a peer on another core arrives within a
// microsecond or two), then yield (ranks may outnumber cores, and the rank we
// wait for may need our core), then sleep in short slices so a long wait (a
// peer busy computing) does not burn a core.
//
// How long to spin adapts per communicator: it doubles while peers keep
// arriving during the spin and halves each time we end up yielding. With 2
// ranks on 2 idle cores every wait ends in the spin (~0.5 us per small
// all_reduce); when ranks share a core (more ranks than cores, or a busy
// machine) spinning only delays the peer that needs our core, and a fixed
// spin of 2000 made 4 ranks on 2 cores ~10x slower.
class Backoff {
 public:
  static constexpr uint32_t kMinSpins = 4;
  static constexpr uint32_t kMaxSpins = 512;  // ~14 us of PAUSE on current x86
  static constexpr uint32_t kInitialSpins = 64;

  explicit Backoff(uint32_t& budget) : budget_(budget), spins_(budget) {}
  ~Backoff() {
    if (n_ == 0) return;  // did not wait at all: no evidence either way
    budget_ = n_ < spins_ ? std::min(kMaxSpins, budget_ * 2) : std::max(kMinSpins, budget_ / 2);
  }
  Backoff(const Backoff&) = delete;
  Backoff& operator=(const Backoff&) = delete;

  void pause() {
    ++n_;
    if (n_ < spins_) {
      cpu_relax();
    } else if (n_ < spins_ + kYields) {
      sched_yield();
    } else {
      struct timespec ts = {0, 50 * 1000};
      nanosleep(&ts, nullptr);
    }
  }
  // The clock is read every iteration once we yield (a yield costs more than
  // the vDSO clock read) and every 64 spins before that.
  bool clock_due() const { return n_ >= spins_ || (n_ & 63u) == 0; }

 private:
  static constexpr uint32_t kYields = 4000;
  uint32_t& budget_;
  const uint32_t spins_;
  uint32_t n_ = 0;
};

struct Op;
struct Group;

struct alignas(64) Slot {
  // Number of collectives this rank has entered on the group; only read to
  // name the missing ranks in a timeout message.
  std::atomic<uint64_t> entered{0};
  int kind = 0;
  int dtype = 0;
  int op = 0;
  int root = 0;
  uint64_t count = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  int err = SP_OK;
  std::string why;
  int color = 0;
  int key = 0;
  std::shared_ptr<Group> child;
};

struct alignas(64) PaddedWord {
  std::atomic<uint64_t> v{0};
};

struct Mail {
  int src = 0;
  int tag = 0;
  int dtype = 0;
  uint64_t count = 0;
  std::vector<unsigned char> data;
};

struct Mailbox {
  std::deque<Mail> eager;                   // sent before a matching receive was posted
  std::deque<std::shared_ptr<Op>> posted;   // receives waiting for a send
};

// Barrier words: generation in the high 32 bits, arrivals in the low 31, and
// a "broken" bit. Breaking (timeout, abort) and arriving are both CAS on the
// same word, so either all n ranks pass a generation or none does: a rank that
// gave up can never leave a peer working on its buffers.
constexpr uint64_t kBroken = 1ull << 31;
constexpr uint64_t kCountMask = kBroken - 1;

struct Group {
  Group(std::string n, int size) : name(std::move(n)), n(size), slots(size), boxes(size) {}

  const std::string name;
  const int n;
  PaddedWord entry;
  PaddedWord exit;
  alignas(64) std::atomic<bool> aborted{false};
  std::mutex mu;  // abort_reason, children
  std::string abort_reason;
  std::vector<std::weak_ptr<Group>> children;
  std::vector<Slot> slots;
  std::mutex p2p_mu;
  std::vector<Mailbox> boxes;  // indexed by receiving rank

  std::string reason() {
    std::lock_guard<std::mutex> lock(mu);
    return abort_reason;
  }
};

struct Desc {
  int kind = 0;
  bool has_send = false;
  bool has_recv = false;
  sp_buffer send{};
  sp_buffer recv{};
  int32_t op = 0;
  int32_t root = 0;
  int32_t peer = 0;
  int32_t tag = 0;
  int32_t color = 0;
  int32_t key = 0;
};

struct Comm;

struct Op {
  Desc d;
  std::shared_ptr<Group> g;
  int rank = 0;
  int64_t timeout_ms = 0;
  std::vector<std::shared_ptr<Op>> deps;  // receives issued earlier and not yet finished
  std::mutex m;
  std::condition_variable cv;
  std::atomic<bool> done{false};
  int status = SP_OK;
  std::string msg;
  bool posted = false;  // a receive sitting in a mailbox (guarded by m)
  Clock::time_point deadline{};
  sp_comm* split_out = nullptr;
};

struct WorkHandle {
  std::shared_ptr<Op> op;
};

void complete(Op* op, int status, std::string msg) {
  {
    std::lock_guard<std::mutex> lock(op->m);
    if (op->done.load(std::memory_order_relaxed)) return;
    op->status = status;
    op->msg = std::move(msg);
    op->posted = false;
    op->done.store(true, std::memory_order_release);
  }
  op->cv.notify_all();
}

void abort_group(const std::shared_ptr<Group>& g, const std::string& reason) {
  std::vector<std::shared_ptr<Group>> kids;
  {
    std::lock_guard<std::mutex> lock(g->mu);
    if (!g->aborted.load()) {
      g->abort_reason = reason;
      g->aborted.store(true, std::memory_order_release);
    }
    for (auto& w : g->children)
      if (auto k = w.lock()) kids.push_back(std::move(k));
  }
  for (auto& k : kids) abort_group(k, reason + ", inherited from group '" + g->name + "'");
  std::vector<std::shared_ptr<Op>> waiting;
  {
    std::lock_guard<std::mutex> lock(g->p2p_mu);
    for (auto& box : g->boxes) {
      for (auto& op : box.posted) waiting.push_back(op);
      box.posted.clear();
    }
  }
  for (auto& op : waiting)
    complete(op.get(), SP_ERR_ABORTED,
             "local recv: group '" + g->name + "' was aborted (" + g->reason() + ")");
}

struct Comm {
  Comm(std::shared_ptr<Group> group, int r, int64_t timeout)
      : g(std::move(group)), rank(r), n(g->n), timeout_ms(timeout), srcs(n), dsts(n) {}

  std::shared_ptr<Group> g;
  const int rank;
  const int n;
  const int64_t timeout_ms;
  uint64_t seq = 0;      // collectives entered on g
  uint32_t splits = 0;   // splits done on g, names the children
  uint32_t spin_budget = Backoff::kInitialSpins;  // see Backoff; touched by whichever thread runs the op
  std::vector<unsigned char> scratch;
  std::vector<const void*> srcs;
  std::vector<void*> dsts;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Op>> queue;
  bool busy = false;
  bool stop = false;
  std::thread worker;
  // Touched only by the thread issuing operations (one at a time, per the ABI).
  std::vector<std::shared_ptr<Op>> recvs;

  unsigned char* scratch_for(size_t bytes, std::vector<unsigned char>& v) {
    if (v.size() < bytes) v.resize(bytes);
    return v.data();
  }
};

Comm* as_comm(sp_comm* p) { return reinterpret_cast<Comm*>(p); }
const Comm* as_comm(const sp_comm* p) { return reinterpret_cast<const Comm*>(p); }

// ---------------------------------------------------------------- barriers

std::string missing_ranks(Comm* c) {
  std::string out;
  int k = 0;
  for (int j = 0; j < c->n; ++j) {
    if (c->g->slots[j].entered.load(std::memory_order_relaxed) >= c->seq) continue;
    if (k++ < 8) out += (out.empty() ? "" : ", ") + std::to_string(j);
  }
  if (k > 8) out += ", ...";
  if (k == 0) return "a peer";
  return (k == 1 ? "rank " : "ranks ") + out;
}

std::string aborted_msg(Group& g, const char* what) {
  return std::string("local ") + what + ": group '" + g.name + "' was aborted (" + g.reason() + ")";
}

int enter(Comm* c, const char* what, std::string& msg) {
  Group& g = *c->g;
  auto& w = g.entry.v;
  uint64_t v = w.load(std::memory_order_acquire);
  for (;;) {
    if (v & kBroken) {
      msg = aborted_msg(g, what);
      return SP_ERR_ABORTED;
    }
    if (g.aborted.load(std::memory_order_acquire)) {
      if (w.compare_exchange_weak(v, v | kBroken, std::memory_order_acq_rel, std::memory_order_acquire))
        v |= kBroken;
      continue;
    }
    if (w.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel, std::memory_order_acquire)) break;
  }
  const uint64_t gen = v >> 32;
  if ((v & kCountMask) + 1 == static_cast<uint64_t>(c->n)) {
    // Nobody else can touch the word now: all n ranks have arrived, and
    // breaking needs fewer than n.
    w.store((gen + 1) << 32, std::memory_order_release);
    return SP_OK;
  }
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(c->timeout_ms);
  Backoff backoff(c->spin_budget);
  for (;;) {
    v = w.load(std::memory_order_acquire);
    if ((v >> 32) != gen || (v & kCountMask) == static_cast<uint64_t>(c->n)) return SP_OK;
    if (v & kBroken) {
      msg = aborted_msg(g, what);
      return SP_ERR_ABORTED;
    }
    const bool aborted = g.aborted.load(std::memory_order_relaxed);
    const bool late = !aborted && backoff.clock_due() && Clock::now() >= deadline;
    if (aborted || late) {
      if (!w.compare_exchange_strong(v, v | kBroken, std::memory_order_acq_rel, std::memory_order_acquire))
        continue;  // someone arrived meanwhile: look again
      if (aborted) {
        msg = aborted_msg(g, what);
        return SP_ERR_ABORTED;
      }
      const std::string who = missing_ranks(c);
      msg = std::string("local ") + what + ": timed out after " + ms_str(c->timeout_ms) + " waiting for " +
            who + " of group '" + g.name + "'";
      // The broken word already stops this group; the reason tells the peers why.
      abort_group(c->g, "rank " + std::to_string(c->rank) + " timed out in " + what + " waiting for " + who);
      return SP_ERR_TIMEOUT;
    }
    backoff.pause();
  }
}

// Cannot fail and needs no deadline: only ranks that passed the entry barrier
// get here, each after a bounded amount of copying.
void leave(Comm* c) {
  auto& w = c->g->exit.v;
  const uint64_t v = w.fetch_add(1, std::memory_order_acq_rel);
  const uint64_t gen = v >> 32;
  if ((v & kCountMask) + 1 == static_cast<uint64_t>(c->n)) {
    w.store((gen + 1) << 32, std::memory_order_release);
    return;
  }
  Backoff backoff(c->spin_budget);
  while ((w.load(std::memory_order_acquire) >> 32) == gen) backoff.pause();
}

// ---------------------------------------------------------------- collectives

std::string check_buffer(const char* what, const char* which, const sp_buffer& b) {
  const std::string pre = std::string("local ") + what + ": " + which + " buffer ";
  if (dtype_size(b.dtype) == 0) return pre + "has unknown dtype " + std::to_string(b.dtype);
  if (b.device_type != SP_DEVICE_CPU) return pre + "is not on the CPU (device type " + std::to_string(b.device_type) + ")";
  if (b.count > 0 && b.data == nullptr) return pre + "is NULL with " + std::to_string(b.count) + " elements";
  return {};
}

struct Local {
  int err = SP_OK;
  std::string why;
  int dtype = 0;
  uint64_t count = 0;
};

Local validate(const Desc& d, int n, int rank) {
  Local L;
  const char* what = kind_name(d.kind);
  auto bad = [&](int st, std::string m) {
    L.err = st;
    L.why = std::move(m);
    return L;
  };
  auto buf = [&](const char* which, const sp_buffer& b) -> bool {
    std::string e = check_buffer(what, which, b);
    if (e.empty()) return true;
    L.err = b.device_type != SP_DEVICE_CPU && dtype_size(b.dtype) ? SP_ERR_UNSUPPORTED : SP_ERR_INVALID;
    L.why = std::move(e);
    return false;
  };
  auto need = [&](bool has, const char* which) -> bool {
    if (has) return true;
    L.err = SP_ERR_INVALID;
    L.why = std::string("local ") + what + ": " + which + " buffer is required";
    return false;
  };
  auto same_dtype = [&]() -> bool {
    if (d.send.dtype == d.recv.dtype) return true;
    L.err = SP_ERR_INVALID;
    L.why = std::string("local ") + what + ": send is " + dtype_name(d.send.dtype) + " but recv is " +
            dtype_name(d.recv.dtype);
    return false;
  };
  auto counts = [&](const char* rule) {
    L.err = SP_ERR_INVALID;
    L.why = std::string("local ") + what + ": send has " + std::to_string(d.send.count) + " elements, recv " +
            std::to_string(d.recv.count) + " (" + rule + ", " + std::to_string(n) + " ranks)";
    return L;
  };
  if (has_op(d.kind) && (d.op < SP_SUM || d.op > SP_PROD))
    return bad(SP_ERR_INVALID, std::string("local ") + what + ": unknown reduce op " + std::to_string(d.op));
  if (has_root(d.kind) && (d.root < 0 || d.root >= n))
    return bad(SP_ERR_INVALID, std::string("local ") + what + ": root " + std::to_string(d.root) +
                                   " is not a rank of a group of " + std::to_string(n));
  const uint64_t un = static_cast<uint64_t>(n);
  switch (d.kind) {
    case K_ALL_REDUCE:
    case K_ALL_GATHER:
    case K_REDUCE_SCATTER:
    case K_ALL_TO_ALL: {
      if (!need(d.has_send, "send") || !need(d.has_recv, "recv") || !buf("send", d.send) ||
          !buf("recv", d.recv) || !same_dtype())
        return L;
      L.dtype = d.send.dtype;
      if (d.kind == K_ALL_REDUCE) {
        if (d.send.count != d.recv.count) return counts("must be equal");
        L.count = d.send.count;
      } else if (d.kind == K_ALL_GATHER) {
        if (d.recv.count / un != d.send.count || d.recv.count % un) return counts("recv must be send x ranks");
        L.count = d.send.count;
      } else if (d.kind == K_REDUCE_SCATTER) {
        if (d.send.count / un != d.recv.count || d.send.count % un) return counts("send must be recv x ranks");
        L.count = d.recv.count;
      } else {
        if (d.send.count != d.recv.count || d.send.count % un)
          return counts("must be equal and divisible by the number of ranks");
        L.count = d.send.count;
      }
      return L;
    }
    case K_BROADCAST: {
      if (rank == d.root) {
        if (!need(d.has_send, "send") || !buf("send", d.send)) return L;
        if (d.has_recv) {
          if (!buf("recv", d.recv) || !same_dtype()) return L;
          if (d.send.count != d.recv.count) return counts("must be equal");
        }
        L.dtype = d.send.dtype;
        L.count = d.send.count;
      } else {
        if (!need(d.has_recv, "recv") || !buf("recv", d.recv)) return L;
        L.dtype = d.recv.dtype;
        L.count = d.recv.count;
      }
      return L;
    }
    case K_SCATTER: {
      if (!need(d.has_recv, "recv") || !buf("recv", d.recv)) return L;
      if (rank == d.root) {
        if (!need(d.has_send, "send") || !buf("send", d.send) || !same_dtype()) return L;
        if (d.send.count / un != d.recv.count || d.send.count % un) return counts("send must be recv x ranks");
      }
      L.dtype = d.recv.dtype;
      L.count = d.recv.count;
      return L;
    }
    case K_GATHER: {
      if (!need(d.has_send, "send") || !buf("send", d.send)) return L;
      if (rank == d.root) {
        if (!need(d.has_recv, "recv") || !buf("recv", d.recv) || !same_dtype()) return L;
        if (d.recv.count / un != d.send.count || d.recv.count % un) return counts("recv must be send x ranks");
      }
      L.dtype = d.send.dtype;
      L.count = d.send.count;
      return L;
    }
    default:
      return L;  // barrier, split
  }
}

std::string describe_slot(const Slot& s) {
  std::string out = kind_name(s.kind);
  if (s.kind == K_BARRIER || s.kind == K_SPLIT) return out;
  out += std::string(" of ") + std::to_string(s.count) + " " + dtype_name(s.dtype);
  if (has_op(s.kind)) out += std::string(" ") + reduce_op_name(s.op);
  if (has_root(s.kind)) out += " root " + std::to_string(s.root);
  return out;
}

// Whether a collective moving `bytes` (all ranks' buffers together) should
// write with non-temporal stores: only when the data cannot stay in the last
// level cache anyway, so a consumer reading the result right away after a
// small collective still finds it cached. Capped at 32 MiB because VMs and
// chiplet CPUs report the whole package's L3 (384 MiB on the 2-core Debian VM
// this was tuned on), far more than the slice these threads share.
bool use_streaming(size_t bytes) {
  static const size_t threshold = [] {
    const size_t cap = size_t{32} << 20;
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return l3 > 0 ? std::min(static_cast<size_t>(l3), cap) : cap;
  }();
  return bytes > threshold;
}

void copy(void* dst, const void* src, size_t bytes, bool stream) {
  if (stream)
    stream_copy(dst, src, bytes);
  else
    std::memcpy(dst, src, bytes);
}

// What to do after the exit barrier (copies into this rank's own buffers that
// had to wait until no peer reads the source any more).
struct After {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

void split_phase(Comm* c, int& out_rank, std::shared_ptr<Group>& out_group);

int run_collective(Comm* c, const Desc& d, std::string& msg, sp_comm** split_out) {
  Group& g = *c->g;
  const int n = c->n, r = c->rank;
  const char* what = kind_name(d.kind);
  Slot& me = g.slots[r];

  Local L = validate(d, n, r);
  const size_t es = L.err == SP_OK ? std::max<size_t>(1, dtype_size(L.dtype)) : 1;
  const void* send = d.has_send ? d.send.data : nullptr;
  void* recv = d.has_recv ? d.recv.data : nullptr;
  After after;
  void* rs_dst = recv;  // reduce_scatter: where this rank's result is computed

  if (L.err == SP_OK) {
    const size_t sbytes = d.has_send ? d.send.count * es : 0;
    const size_t rbytes = d.has_recv ? d.recv.count * es : 0;
    const bool ov = d.has_send && d.has_recv && overlaps(send, sbytes, recv, rbytes);
    const size_t blk = L.count * es;  // per-rank block, for the rank-major layouts
    switch (d.kind) {
      case K_ALL_REDUCE:
        // Equal pointers are fine (read-all-then-write-all per element); a
        // partial overlap would let a peer's writes reach our unread input.
        if (ov && send != recv) {
          void* s = c->scratch_for(sbytes, c->scratch);
          std::memcpy(s, send, sbytes);
          send = s;
        }
        break;
      case K_ALL_GATHER:
      case K_ALL_TO_ALL: {
        // Peers read our send while we write our recv blocks. Only our own
        // block of an all_gather may coincide with our send.
        const bool own_block = d.kind == K_ALL_GATHER && send == static_cast<char*>(recv) + r * blk;
        const bool self_only = d.kind == K_ALL_TO_ALL && n == 1 && send == recv;
        if (ov && !own_block && !self_only) {
          void* s = c->scratch_for(sbytes, c->scratch);
          std::memcpy(s, send, sbytes);
          send = s;
        }
        break;
      }
      case K_REDUCE_SCATTER:
        // Peers read blocks j != r of our send; only block r may be our recv.
        if (ov && recv != static_cast<const char*>(send) + r * blk) {
          rs_dst = c->scratch_for(rbytes, c->scratch);
          after = {recv, rs_dst, rbytes};
        }
        break;
      case K_BROADCAST:
        if (r == d.root && d.has_recv && recv != send && ov) after = {recv, send, rbytes};  // as for scatter
        break;
      case K_SCATTER:
        // Peers read our send during the data phase: an overlapping recv is
        // filled after the exit barrier.
        if (r == d.root && ov && recv != static_cast<const char*>(send) + r * blk)
          after = {recv, static_cast<const char*>(send) + r * blk, rbytes};
        break;
      case K_GATHER:
        // Our own block goes in before anyone writes the others, so it does
        // not matter whether our send overlaps them.
        if (r == d.root && blk && send != static_cast<char*>(recv) + r * blk)
          std::memmove(static_cast<char*>(recv) + r * blk, send, blk);
        break;
      default:
        break;
    }
  }

  me.kind = d.kind;
  me.dtype = L.dtype;
  me.count = L.count;
  me.op = d.op;
  me.root = d.root;
  me.send = send;
  me.recv = recv;
  me.err = L.err;
  if (L.err != SP_OK) me.why = L.why;
  me.color = d.color;
  me.key = d.key;
  ++c->seq;
  me.entered.store(c->seq, std::memory_order_relaxed);

  int st = enter(c, what, msg);
  if (st != SP_OK) return st;

  // Everyone sees the same slots, so everyone takes the same branch here.
  int bad = -1;
  for (int j = 0; j < n && bad < 0; ++j) {
    const Slot& s = g.slots[j];
    if (s.err != SP_OK) {
      bad = j;
      st = s.err;
      msg = j == r ? L.why
                   : std::string("local ") + what + ": rank " + std::to_string(j) +
                         " of group '" + g.name + "' passed bad arguments: " + s.why;
    }
  }
  if (bad < 0) {
    const Slot& s0 = g.slots[0];
    for (int j = 1; j < n && bad < 0; ++j) {
      const Slot& s = g.slots[j];
      const bool same = s.kind == s0.kind && s.dtype == s0.dtype && s.count == s0.count &&
                        (!has_op(s.kind) || s.op == s0.op) && (!has_root(s.kind) || s.root == s0.root);
      if (!same) {
        bad = j;
        st = SP_ERR_INVALID;
        msg = std::string("local ") + what + ": ranks of group '" + g.name + "' disagree: rank 0 called " +
              describe_slot(s0) + ", rank " + std::to_string(j) + " called " + describe_slot(s);
      }
    }
  }

  int new_rank = -1;
  std::shared_ptr<Group> child;
  if (bad < 0) {
    const size_t cnt = L.count;
    const size_t blk = cnt * es;
    // Every rank's input and output, as seen by the cache.
    const size_t rank_bytes = d.kind == K_ALL_REDUCE || d.kind == K_ALL_TO_ALL ? 2 * blk
                              : d.kind == K_BROADCAST || d.kind == K_SCATTER || d.kind == K_GATHER ? blk
                                                                                                   : (n + 1) * blk;
    const bool stream = use_streaming(rank_bytes * n);
    switch (d.kind) {
      case K_ALL_REDUCE: {
        // 64-byte aligned chunks: no two ranks write the same cache line.
        const size_t line = std::max<size_t>(1, 64 / es);
        const size_t chunk = ((cnt + n - 1) / n + line - 1) / line * line;
        const size_t lo = std::min(cnt, chunk * r), hi = std::min(cnt, lo + chunk);
        if (hi > lo) {
          for (int k = 0; k < n; ++k) {
            c->srcs[k] = static_cast<const char*>(g.slots[k].send) + lo * es;
            c->dsts[k] = static_cast<char*>(g.slots[k].recv) + lo * es;
          }
          reduce_fn(L.dtype, d.op)(c->dsts.data(), n, c->srcs.data(), n, hi - lo, stream);
        }
        break;
      }
      case K_REDUCE_SCATTER:
        if (cnt) {
          for (int k = 0; k < n; ++k) c->srcs[k] = static_cast<const char*>(g.slots[k].send) + r * blk;
          c->dsts[0] = rs_dst;
          reduce_fn(L.dtype, d.op)(c->dsts.data(), 1, c->srcs.data(), n, cnt,
                                   stream && !after.bytes && rs_dst != c->srcs[r]);
        }
        break;
      case K_ALL_GATHER:
        for (int j = 0; j < n && blk; ++j) {
          char* dst = static_cast<char*>(recv) + j * blk;
          if (dst != g.slots[j].send) copy(dst, g.slots[j].send, blk, stream);
        }
        break;
      case K_ALL_TO_ALL: {
        const size_t b = blk / n;
        for (int j = 0; j < n && b; ++j) {
          char* dst = static_cast<char*>(recv) + j * b;
          const char* src = static_cast<const char*>(g.slots[j].send) + r * b;
          if (dst != src) copy(dst, src, b, stream);
        }
        break;
      }
      case K_BROADCAST:
        if (blk && recv && !after.bytes && recv != g.slots[d.root].send)
          copy(recv, g.slots[d.root].send, blk, stream);
        break;
      case K_SCATTER: {
        const char* src = static_cast<const char*>(g.slots[d.root].send) + r * blk;
        if (blk && !after.bytes && recv != src) copy(recv, src, blk, stream);
        break;
      }
      case K_GATHER:
        if (blk && r != d.root) copy(static_cast<char*>(g.slots[d.root].recv) + r * blk, send, blk, stream);
        break;
      case K_SPLIT:
        split_phase(c, new_rank, child);
        break;
      default:
        break;
    }
    if (stream) stream_fence();
  }

  leave(c);

  if (bad >= 0) return st;
  if (after.bytes) std::memmove(after.dst, after.src, after.bytes);
  if (d.kind == K_SPLIT) {
    if (me.child) me.child.reset();  // we were the leader: the members have their copies now
    *split_out = child ? reinterpret_cast<sp_comm*>(new Comm(child, new_rank, c->timeout_ms)) : nullptr;
  }
  return SP_OK;
}

// Inside the data phase of split: the first member of each color (in new-rank
// order) creates the child group, a second barrier publishes it, and the
// others pick it up.
void split_phase(Comm* c, int& out_rank, std::shared_ptr<Group>& out_group) {
  Group& g = *c->g;
  const int r = c->rank;
  const int color = g.slots[r].color;
  std::vector<std::pair<int, int>> members;  // (key, parent rank)
  if (color >= 0)
    for (int j = 0; j < c->n; ++j)
      if (g.slots[j].color == color) members.emplace_back(g.slots[j].key, j);
  std::sort(members.begin(), members.end());
  int leader = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == r) out_rank = static_cast<int>(i);
  }
  if (!members.empty()) leader = members[0].second;
  const uint32_t index = c->splits++;
  if (leader == r) {
    auto child = std::make_shared<Group>(g.name + "/split" + std::to_string(index) + "." + std::to_string(color),
                                         static_cast<int>(members.size()));
    {
      std::lock_guard<std::mutex> lock(g.mu);
      g.children.erase(std::remove_if(g.children.begin(), g.children.end(),
                                      [](const std::weak_ptr<Group>& w) { return w.expired(); }),
                       g.children.end());
      g.children.push_back(child);
      if (g.aborted.load()) {
        child->abort_reason = "inherited from group '" + g.name + "': " + g.abort_reason;
        child->aborted.store(true);
      }
    }
    g.slots[r].child = child;
  }
  leave(c);
  if (leader >= 0) out_group = g.slots[leader].child;
}

// ---------------------------------------------------------------- point to point

std::string recv_timeout_msg(const Op& op, const Group& g) {
  return "local recv: timed out after " + ms_str(op.timeout_ms) + " waiting for rank " + std::to_string(op.d.peer) +
         " (tag " + std::to_string(op.d.tag) + ") of group '" + g.name + "'";
}

Local validate_p2p(const Desc& d, int n) {
  Local L;
  const char* what = kind_name(d.kind);
  const sp_buffer& b = d.kind == K_SEND ? d.send : d.recv;
  if (!(d.kind == K_SEND ? d.has_send : d.has_recv)) {
    L.err = SP_ERR_INVALID;
    L.why = std::string("local ") + what + ": buffer is required";
    return L;
  }
  L.why = check_buffer(what, d.kind == K_SEND ? "send" : "recv", b);
  if (!L.why.empty()) {
    L.err = b.device_type != SP_DEVICE_CPU && dtype_size(b.dtype) ? SP_ERR_UNSUPPORTED : SP_ERR_INVALID;
    return L;
  }
  if (d.peer < 0 || d.peer >= n) {
    L.err = SP_ERR_INVALID;
    L.why = std::string("local ") + what + ": peer " + std::to_string(d.peer) + " is not a rank of a group of " +
            std::to_string(n);
  }
  return L;
}

// Takes the first receive posted by `dst` that waits for (src, tag); expired
// ones met on the way are failed and dropped. Caller holds p2p_mu.
std::shared_ptr<Op> take_posted(Group& g, int dst, int src, int tag, const Clock::time_point now) {
  auto& posted = g.boxes[dst].posted;
  for (auto it = posted.begin(); it != posted.end();) {
    Op* op = it->get();
    if (op->d.peer != src || op->d.tag != tag) {
      ++it;
      continue;
    }
    std::shared_ptr<Op> found = *it;
    it = posted.erase(it);
    bool expired;
    {
      std::lock_guard<std::mutex> lock(op->m);
      op->posted = false;
      expired = now >= op->deadline;
    }
    if (!expired) return found;
    complete(op, SP_ERR_TIMEOUT, recv_timeout_msg(*op, g));
  }
  return nullptr;
}

// Copies a message into a claimed receive. Returns the sender's status.
int deliver(Op* op, Group& g, int src, const void* data, uint64_t count, int dtype, std::string& msg) {
  const sp_buffer& rb = op->d.recv;
  if (count != rb.count || dtype != rb.dtype) {
    std::string m = "local recv: rank " + std::to_string(src) + " sent " + std::to_string(count) + " " +
                    dtype_name(dtype) + " (tag " + std::to_string(op->d.tag) + ") but the receive on rank " +
                    std::to_string(op->rank) + " of group '" + g.name + "' expects " + std::to_string(rb.count) +
                    " " + dtype_name(rb.dtype);
    msg = "local send" + m.substr(std::strlen("local recv"));
    complete(op, SP_ERR_INVALID, std::move(m));
    return SP_ERR_INVALID;
  }
  if (count) std::memcpy(rb.data, data, count * dtype_size(dtype));
  complete(op, SP_OK, {});
  return SP_OK;
}

int do_send(Comm* c, const Desc& d, std::string& msg) {
  Group& g = *c->g;
  Local L = validate_p2p(d, c->n);
  if (L.err) {
    msg = L.why;
    return L.err;
  }
  const size_t bytes = d.send.count * dtype_size(d.send.dtype);
  std::unique_lock<std::mutex> lock(g.p2p_mu);
  if (g.aborted.load()) {
    lock.unlock();
    msg = aborted_msg(g, "send");
    return SP_ERR_ABORTED;
  }
  auto target = take_posted(g, d.peer, c->rank, d.tag, Clock::now());
  if (target) {
    lock.unlock();
    return deliver(target.get(), g, c->rank, d.send.data, d.send.count, d.send.dtype, msg);
  }
  lock.unlock();
  // Copy without holding the group's lock, then look again: a receive may
  // have been posted meanwhile.
  Mail mail;
  mail.src = c->rank;
  mail.tag = d.tag;
  mail.dtype = d.send.dtype;
  mail.count = d.send.count;
  mail.data.assign(static_cast<const unsigned char*>(d.send.data),
                   static_cast<const unsigned char*>(d.send.data) + bytes);
  lock.lock();
  target = take_posted(g, d.peer, c->rank, d.tag, Clock::now());
  if (target) {
    lock.unlock();
    return deliver(target.get(), g, c->rank, mail.data.data(), mail.count, mail.dtype, msg);
  }
  g.boxes[d.peer].eager.push_back(std::move(mail));
  return SP_OK;
}

// Completes `op` from a waiting message, or leaves it posted for a sender.
void post_recv(Comm* c, const std::shared_ptr<Op>& op) {
  Group& g = *c->g;
  const Desc& d = op->d;
  Local L = validate_p2p(d, c->n);
  if (L.err) return complete(op.get(), L.err, L.why);
  std::unique_lock<std::mutex> lock(g.p2p_mu);
  if (g.aborted.load()) {
    lock.unlock();
    return complete(op.get(), SP_ERR_ABORTED, aborted_msg(g, "recv"));
  }
  auto& eager = g.boxes[c->rank].eager;
  for (auto it = eager.begin(); it != eager.end(); ++it) {
    if (it->src != d.peer || it->tag != d.tag) continue;
    Mail mail = std::move(*it);
    eager.erase(it);
    lock.unlock();
    std::string ignored;
    deliver(op.get(), g, mail.src, mail.data.data(), mail.count, mail.dtype, ignored);
    return;
  }
  {
    std::lock_guard<std::mutex> l(op->m);
    op->posted = true;
    op->deadline = Clock::now() + std::chrono::milliseconds(c->timeout_ms);
  }
  g.boxes[c->rank].posted.push_back(op);
  lock.unlock();
  op->cv.notify_all();  // waiters learn the deadline
}

void expire_recv(Op* op) {
  Group& g = *op->g;
  std::shared_ptr<Op> found;
  {
    std::lock_guard<std::mutex> lock(g.p2p_mu);
    auto& posted = g.boxes[op->rank].posted;
    for (auto it = posted.begin(); it != posted.end(); ++it) {
      if (it->get() != op) continue;
      found = *it;
      posted.erase(it);
      break;
    }
    if (found) {
      std::lock_guard<std::mutex> l(op->m);
      op->posted = false;
    }
  }
  if (found) complete(op, SP_ERR_TIMEOUT, recv_timeout_msg(*op, g));
}

// ---------------------------------------------------------------- async machinery

// True once `op` itself finished; false when user_deadline came first. A
// posted receive is failed here when its own deadline passes.
bool wait_done(Op* op, Clock::time_point user_deadline) {
  std::unique_lock<std::mutex> lock(op->m);
  for (;;) {
    if (op->done.load(std::memory_order_acquire)) return true;
    Clock::time_point until = user_deadline;
    if (op->posted && op->deadline < until) until = op->deadline;
    if (until == Clock::time_point::max())
      op->cv.wait(lock);
    else
      op->cv.wait_until(lock, until);
    if (op->done.load(std::memory_order_acquire)) return true;
    const auto now = Clock::now();
    if (op->posted && now >= op->deadline) {
      lock.unlock();
      expire_recv(op);
      lock.lock();
      continue;
    }
    if (now >= user_deadline) return false;
  }
}

// Complete in the ABI's sense: this operation and every receive issued before it.
bool wait_all(Op* op, Clock::time_point user_deadline) {
  for (auto& dep : op->deps)
    if (!wait_done(dep.get(), user_deadline)) return false;
  return wait_done(op, user_deadline);
}

void execute(Comm* c, const std::shared_ptr<Op>& op) {
  std::string msg;
  int st;
  switch (op->d.kind) {
    case K_SEND:
      st = do_send(c, op->d, msg);
      break;
    case K_RECV:
      post_recv(c, op);
      return;
    default:
      st = run_collective(c, op->d, msg, &op->split_out);
      break;
  }
  complete(op.get(), st, std::move(msg));
}

void worker_main(Comm* c) {
  for (;;) {
    std::shared_ptr<Op> op;
    {
      std::unique_lock<std::mutex> lock(c->mu);
      c->cv.wait(lock, [&] { return c->stop || !c->queue.empty(); });
      if (c->queue.empty()) return;
      op = std::move(c->queue.front());
      c->queue.pop_front();
      c->busy = true;
    }
    execute(c, op);
    std::lock_guard<std::mutex> lock(c->mu);
    c->busy = false;
  }
}

void enqueue(Comm* c, std::shared_ptr<Op> op) {
  {
    std::lock_guard<std::mutex> lock(c->mu);
    if (!c->worker.joinable()) c->worker = std::thread(worker_main, c);
    c->queue.push_back(std::move(op));
  }
  c->cv.notify_one();
}

std::shared_ptr<Op> make_op(Comm* c, const Desc& d) {
  auto op = std::make_shared<Op>();
  op->d = d;
  op->g = c->g;
  op->rank = c->rank;
  op->timeout_ms = c->timeout_ms;
  op->deps = c->recvs;
  return op;
}

int issue(sp_comm* pc, const Desc& d, sp_work** work, sp_comm** split_out = nullptr) {
  const char* what = kind_name(d.kind);
  if (work) *work = nullptr;
  Comm* c = as_comm(pc);
  if (!c) return fail(SP_ERR_INVALID, std::string("local ") + what + ": communicator is NULL");
  auto& recvs = c->recvs;
  if (!recvs.empty())
    recvs.erase(std::remove_if(recvs.begin(), recvs.end(),
                               [](const std::shared_ptr<Op>& o) { return o->done.load(std::memory_order_acquire); }),
                recvs.end());
  bool idle;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    idle = c->queue.empty() && !c->busy;
  }
  const auto forever = Clock::time_point::max();

  if (!work) {
    int st;
    std::string msg;
    if (!idle || d.kind == K_RECV) {
      auto op = make_op(c, d);
      if (idle)
        post_recv(c, op);
      else
        enqueue(c, op);
      wait_all(op.get(), forever);
      st = op->status;
      msg = op->msg;
      if (split_out) *split_out = op->split_out;
    } else {
      st = d.kind == K_SEND ? do_send(c, d, msg) : run_collective(c, d, msg, split_out);
      for (auto& dep : recvs) wait_done(dep.get(), forever);
    }
    if (st != SP_OK) last_error() = std::move(msg);
    return st;
  }

  auto op = make_op(c, d);
  if (idle && is_p2p(d.kind))
    execute(c, op);  // posting is non-blocking: no reason to wake the worker
  else
    enqueue(c, op);
  if (d.kind == K_RECV) recvs.push_back(op);
  *work = reinterpret_cast<sp_work*>(new WorkHandle{std::move(op)});
  return SP_OK;
}

Desc collective(int kind, const sp_buffer* send, const sp_buffer* recv) {
  Desc d;
  d.kind = kind;
  if (send) {
    d.has_send = true;
    d.send = *send;
  }
  if (recv) {
    d.has_recv = true;
    d.recv = *recv;
  }
  return d;
}

// ---------------------------------------------------------------- rendezvous

struct Pending {
  int n = 0;
  std::vector<bool> arrived;
  int count = 0;
  bool complete = false;
  std::shared_ptr<Group> group;
  std::condition_variable cv;
};

std::mutex& registry_mu() {
  static auto* mu = new std::mutex();  // leaked: ranks may still create during static destruction
  return *mu;
}
std::map<std::string, std::shared_ptr<Pending>>& registry() {
  static auto* reg = new std::map<std::string, std::shared_ptr<Pending>>();
  return *reg;
}

int rendezvous(const std::string& id, int rank, int n, int64_t timeout_ms, std::shared_ptr<Group>& out) {
  std::unique_lock<std::mutex> lock(registry_mu());
  auto& reg = registry();
  auto& slot = reg[id];
  if (!slot) {
    slot = std::make_shared<Pending>();
    slot->n = n;
    slot->arrived.assign(n, false);
    slot->group = std::make_shared<Group>(id, n);
  }
  std::shared_ptr<Pending> p = slot;
  if (p->n != n)
    return fail(SP_ERR_INVALID, "local create: rank " + std::to_string(rank) + " says group '" + id + "' has " +
                                    std::to_string(n) + " ranks, an earlier rank said " + std::to_string(p->n));
  if (p->arrived[rank])
    return fail(SP_ERR_INVALID, "local create: rank " + std::to_string(rank) + " of group '" + id +
                                    "' joined twice (is local_id unique per world?)");
  p->arrived[rank] = true;
  if (++p->count == n) {
    // Complete: a later create with the same id starts a new group.
    reg.erase(id);
    p->complete = true;
    p->cv.notify_all();
    out = p->group;
    return SP_OK;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  if (!p->cv.wait_until(lock, deadline, [&] { return p->complete; })) {
    p->arrived[rank] = false;
    --p->count;
    std::string who;
    int k = 0;
    for (int j = 0; j < n; ++j)
      if (!p->arrived[j] && j != rank && k++ < 8) who += (who.empty() ? "" : ", ") + std::to_string(j);
    if (k > 8) who += ", ...";
    if (p->count == 0) {
      auto it = reg.find(id);
      if (it != reg.end() && it->second == p) reg.erase(it);
    }
    return fail(SP_ERR_TIMEOUT, "local create: timed out after " + ms_str(timeout_ms) + " waiting for " +
                                    (k == 1 ? "rank " : "ranks ") + who + " of group '" + id + "'");
  }
  out = p->group;
  return SP_OK;
}

// ---------------------------------------------------------------- the ABI

int api_create(const sp_comm_config* cfg, sp_comm** out) {
  if (int rc = shardplan::comm::check_create("local", cfg, out)) return rc;
  const int n = cfg->world_size, rank = cfg->rank;
  const int64_t timeout = shardplan::comm::timeout_of(*cfg).count();
  std::string id;
  bool have_id = false;
  shardplan::comm::for_each_option(cfg->options, [&](const std::string& k, const std::string& v) {
    if (k != "local_id") return;
    id = v;
    have_id = true;
  });
  std::shared_ptr<Group> g;
  if (!have_id && n == 1) {
    g = std::make_shared<Group>("local", 1);
  } else {
    // Without local_id every world of the process shares the id "default",
    // fine for one world at a time.
    if (!have_id) id = "default";
    int st = rendezvous(id, rank, n, timeout, g);
    if (st != SP_OK) return st;
  }
  *out = reinterpret_cast<sp_comm*>(new Comm(std::move(g), rank, timeout));
  return SP_OK;
}

int api_split(sp_comm* parent, int32_t color, int32_t key, sp_comm** out) {
  if (!out) return fail(SP_ERR_INVALID, "local split: out is NULL");
  *out = nullptr;
  Desc d;
  d.kind = K_SPLIT;
  d.color = color < 0 ? -1 : color;
  d.key = key;
  return issue(parent, d, nullptr, out);
}

int api_abort(sp_comm* pc) {
  Comm* c = as_comm(pc);
  if (!c) return fail(SP_ERR_INVALID, "local abort: communicator is NULL");
  abort_group(c->g, "abort() called on rank " + std::to_string(c->rank));
  return SP_OK;
}

void api_destroy(sp_comm* pc) {
  Comm* c = as_comm(pc);
  if (!c) return;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    c->stop = true;
  }
  c->cv.notify_all();
  if (c->worker.joinable()) c->worker.join();  // queued operations still run (and fail fast if aborted)
  delete c;
}

int32_t api_rank(const sp_comm* c) { return c ? as_comm(c)->rank : -1; }
int32_t api_size(const sp_comm* c) { return c ? as_comm(c)->n : -1; }

int api_all_reduce(sp_comm* c, const sp_buffer* send, const sp_buffer* recv, int32_t op, sp_work** work) {
  Desc d = collective(K_ALL_REDUCE, send, recv);
  d.op = op;
  return issue(c, d, work);
}
int api_all_gather(sp_comm* c, const sp_buffer* send, const sp_buffer* recv, sp_work** work) {
  return issue(c, collective(K_ALL_GATHER, send, recv), work);
}
int api_reduce_scatter(sp_comm* c, const sp_buffer* send, const sp_buffer* recv, int32_t op, sp_work** work) {
  Desc d = collective(K_REDUCE_SCATTER, send, recv);
  d.op = op;
  return issue(c, d, work);
}
int api_broadcast(sp_comm* c, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work) {
  Desc d = collective(K_BROADCAST, send, recv);
  d.root = root;
  return issue(c, d, work);
}
int api_scatter(sp_comm* c, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work) {
  Desc d = collective(K_SCATTER, send, recv);
  d.root = root;
  return issue(c, d, work);
}
int api_gather(sp_comm* c, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work) {
  Desc d = collective(K_GATHER, send, recv);
  d.root = root;
  return issue(c, d, work);
}
int api_all_to_all(sp_comm* c, const sp_buffer* send, const sp_buffer* recv, sp_work** work) {
  return issue(c, collective(K_ALL_TO_ALL, send, recv), work);
}
int api_send(sp_comm* c, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work) {
  Desc d = collective(K_SEND, buf, nullptr);
  d.peer = peer;
  d.tag = tag;
  return issue(c, d, work);
}
int api_recv(sp_comm* c, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work) {
  Desc d = collective(K_RECV, nullptr, buf);
  d.peer = peer;
  d.tag = tag;
  return issue(c, d, work);
}
int api_barrier(sp_comm* c, sp_work** work) { return issue(c, collective(K_BARRIER, nullptr, nullptr), work); }

int api_wait(sp_work* w, int64_t timeout_ms) {
  if (!w) return fail(SP_ERR_INVALID, "local wait: work is NULL");
  Op* op = reinterpret_cast<WorkHandle*>(w)->op.get();
  const auto deadline =
      timeout_ms < 0 ? Clock::time_point::max() : Clock::now() + std::chrono::milliseconds(timeout_ms);
  if (!wait_all(op, deadline))
    return fail(SP_ERR_TIMEOUT, std::string("local wait: ") + kind_name(op->d.kind) + " on group '" + op->g->name +
                                    "' not finished after " + ms_str(timeout_ms));
  if (op->status != SP_OK) last_error() = op->msg;
  return op->status;
}

int api_test(sp_work* w, int32_t* done) {
  if (!w || !done) return fail(SP_ERR_INVALID, "local test: work or done is NULL");
  Op* op = reinterpret_cast<WorkHandle*>(w)->op.get();
  const auto now = Clock::now();
  bool all = true;
  auto check = [&](Op* o) {
    if (o->done.load(std::memory_order_acquire)) return;
    bool overdue;
    {
      std::lock_guard<std::mutex> lock(o->m);
      overdue = o->posted && now >= o->deadline;
    }
    if (overdue) expire_recv(o);
    all = all && o->done.load(std::memory_order_acquire);
  };
  for (auto& dep : op->deps) check(dep.get());
  check(op);
  *done = all ? 1 : 0;
  if (all && op->status != SP_OK) {
    last_error() = op->msg;
    return op->status;
  }
  return SP_OK;
}

void api_release(sp_work* w) { delete reinterpret_cast<WorkHandle*>(w); }

}  // namespace
}  // namespace sp_local

SHARDPLAN_COMM_PLUGIN(sp_local, "local", SP_CAP_CPU | SP_CAP_THREAD_RANKS, "1.0 (threads, shared memory)")
