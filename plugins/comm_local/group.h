#pragma once
// The state ranks share: one Group per communicator group (every rank's slot,
// the barrier words, the mailboxes) and each rank's Comm and Op. Every step
// of the protocol (see local_comm.cpp) works on these, so they live here.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backoff.h"
#include "shardplan/abi/comm.h"

namespace sp_local {

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

inline const char* kind_name(int k) {
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

inline bool is_p2p(int k) { return k == K_SEND || k == K_RECV; }
inline bool has_op(int k) { return k == K_ALL_REDUCE || k == K_REDUCE_SCATTER; }
inline bool has_root(int k) { return k == K_BROADCAST || k == K_SCATTER || k == K_GATHER; }

std::string ms_str(int64_t ms);

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

void complete(Op* op, int status, std::string msg);
void abort_group(const std::shared_ptr<Group>& g, const std::string& reason);

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

inline Comm* as_comm(sp_comm* p) { return reinterpret_cast<Comm*>(p); }
inline const Comm* as_comm(const sp_comm* p) { return reinterpret_cast<const Comm*>(p); }

// Barriers (group.cpp): the only steps of a collective that wait for peers.
std::string aborted_msg(Group& g, const char* what);
int enter(Comm* c, const char* what, std::string& msg);
void leave(Comm* c);

}  // namespace sp_local
