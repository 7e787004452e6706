// The async machinery: one worker thread per communicator runs queued
// operations in issue order, and waits honour the receives issued earlier.
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "collective.h"
#include "group.h"
#include "p2p.h"
#include "shardplan/abi/comm.h"
#include "work.h"

namespace sp_local {

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

namespace {

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

}  // namespace

void enqueue(Comm* c, std::shared_ptr<Op> op) {
  {
    std::lock_guard<std::mutex> lock(c->mu);
    // Through a lambda: std::thread's state type then has this file's linkage;
    // with Comm* as its argument it would export a typeinfo and vtable.
    if (!c->worker.joinable()) c->worker = std::thread([c] { worker_main(c); });
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

}  // namespace sp_local
