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
//
// This file holds the ABI's entry points and issue(), which picks inline or
// queued execution; each step above lives in the file named for it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "collective.h"
#include "group.h"
#include "p2p.h"
#include "rendezvous.h"
#include "shardplan/abi/comm.h"
#include "shardplan/abi/plugin.h"
#include "shardplan/comm_plugin.h"
#include "work.h"

namespace sp_local {
namespace {

using shardplan::comm::fail;
using shardplan::comm::last_error;

struct WorkHandle {
  std::shared_ptr<Op> op;
};

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
