// Synchronisation on a group: the entry/exit barriers every collective
// passes, and abort, which breaks them and fails posted receives. They share
// one file because a barrier that times out aborts the group.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backoff.h"
#include "group.h"
#include "shardplan/abi/comm.h"

namespace sp_local {

std::string ms_str(int64_t ms) { return std::to_string(ms) + " ms"; }

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

namespace {

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

}  // namespace

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

}  // namespace sp_local
