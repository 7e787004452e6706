// For communication backends whose operations run to completion on a thread
// (gloo, mpi): what an operation is (OpInfo), the watch that bounds every
// wait on a communicator's worker (WorkerWatch), the state of one operation
// with the ABI's wait/test/release on it (WorkState, wait_work, ...), and the
// queue that runs a communicator's operations in issue order (InOrderQueue).
//
// Header-only, torch-free and hidden like comm_plugin.h, for the same reasons.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "shardplan/abi/comm.h"
#include "shardplan/comm_plugin.h"

#pragma GCC visibility push(hidden)

namespace shardplan {
namespace comm {

// What an operation is, for messages; the strings are literals.
struct OpInfo {
  const char* backend;
  const char* op;
  int rank;
  int size;
  std::chrono::milliseconds limit;  // the communicator's timeout

  // "gloo all_reduce on rank 1 of 4"; built only when a message needs it.
  std::string what() const {
    return std::string(backend) + " " + op + " on rank " + std::to_string(rank) + " of " + std::to_string(size);
  }
};

// What a communicator's worker is running and since when, shared with the
// waits on its operations so that no wait outlasts a worker stuck past the
// communicator's timeout. Off until a backend gives it a handler
// (InOrderQueue::set_stuck_handler; gloo does); then a wait that finds the
// running operation `margin()` past its limit fails with SP_ERR_TIMEOUT and
// the handler is told once, to break the communicator (abort it, so that
// later calls fail at once instead of racing a worker that may still wake).
class WorkerWatch {
 public:
  using Clock = std::chrono::steady_clock;
  using Handler = std::function<void(const std::string& why)>;

  // Past the limit, the operation's own timeout has had its chance to fire
  // with a better message; the margin covers scheduling delays only.
  static std::chrono::milliseconds margin(std::chrono::milliseconds limit) {
    return std::max(std::chrono::milliseconds(1000), limit / 10);
  }

  void set_handler(Handler h) {
    std::lock_guard<std::mutex> lock(mu_);
    handler_ = std::move(h);
  }
  bool armed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<bool>(handler_);
  }
  void running(const OpInfo& info) {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = true;
    op_ = info.op;
    limit_ = info.limit;
    since_ = Clock::now();
  }
  void idle() {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
  }
  bool busy() const {
    std::lock_guard<std::mutex> lock(mu_);
    return busy_;
  }
  bool tripped() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !why_.empty();
  }

  // Empty while the worker is not stuck. Otherwise why, the handler having
  // been called (under the lock, so set_handler(nullptr) in a destructor
  // waits for it) the first time.
  std::string check() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!why_.empty() || !handler_ || !busy_) return why_;
    const auto ran = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since_);
    if (ran <= limit_ + margin(limit_)) return why_;
    why_ = std::string("timed out: the worker has been running ") + op_ + " for " + std::to_string(ran.count()) +
           " ms, past the communicator's timeout of " + std::to_string(limit_.count()) + " ms";
    handler_(why_);
    return why_;
  }

 private:
  mutable std::mutex mu_;
  Handler handler_;
  bool busy_ = false;
  const char* op_ = "";
  std::chrono::milliseconds limit_{0};
  Clock::time_point since_;
  std::string why_;
};

// One operation of a backend whose operations run to completion, one at a
// time, on a communicator's worker (InOrderQueue): what wait() and test()
// look at, and a blocking call that had to queue behind others.
class WorkState {
 public:
  using Clock = std::chrono::steady_clock;

  // `spin`: how long a wait polls before it sleeps (spin_first()).
  explicit WorkState(const OpInfo& info, std::shared_ptr<WorkerWatch> watch = nullptr,
                     std::chrono::microseconds spin = std::chrono::microseconds(0))
      : info(info), watch_(std::move(watch)), spin_(spin) {}
  WorkState(const WorkState&) = delete;
  WorkState& operator=(const WorkState&) = delete;

  const OpInfo info;

  std::string what() const { return info.what(); }

  void start() {
    std::lock_guard<std::mutex> lock(mu_);
    started_ = true;
    start_ = Clock::now();
  }

  void finish(int status, std::string error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      status_ = status;
      error_ = std::move(error);
    }
    ended_.store(true, std::memory_order_release);
    cv_.notify_all();
  }

  // For a blocking call: the operation gives up after the communicator's
  // timeout by itself; with a watch, the wait also ends when the worker is
  // stuck past it (in this operation or one queued before it).
  int wait_blocking() {
    spin_first(spin_);
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return done_; })) {
      if (int rc = stuck(lock)) return rc;
    }
    return report();
  }

  // The status of a finished operation; a failure's message goes to last_error().
  int report() const {
    if (status_ != SP_OK) last_error() = what() + ": " + error_;
    return status_;
  }

  // The ABI's wait(). timeout_ms < 0 waits until the operation ends, which it
  // does by itself within the communicator's timeout; a margin beyond that
  // only guards against `engine` (what the operation waits in: "MPI", "the
  // transport") never returning.
  int wait(int64_t timeout_ms, const char* engine) {
    using std::chrono::milliseconds;
    spin_first(timeout_ms < 0 ? spin_ : std::min<std::chrono::microseconds>(spin_, milliseconds(timeout_ms)));
    std::unique_lock<std::mutex> lock(mu_);
    if (timeout_ms >= 0) {
      if (!cv_.wait_for(lock, milliseconds(timeout_ms), [&] { return done_; }))
        return fail(SP_ERR_TIMEOUT, what() + ": not finished after " + std::to_string(timeout_ms) + " ms");
      return report();
    }
    while (!cv_.wait_for(lock, milliseconds(200), [&] { return done_; })) {
      if (int rc = stuck(lock)) return rc;
      if (!watch_ && started_ && Clock::now() - start_ > info.limit + milliseconds(30000))
        return fail(SP_ERR_TIMEOUT, what() + ": no answer from " + engine + " " +
                                        std::to_string(info.limit.count()) + " ms after it started");
    }
    return report();
  }

  // The ABI's test().
  int test(int32_t* done) {
    std::lock_guard<std::mutex> lock(mu_);
    *done = done_ ? 1 : 0;
    return done_ ? report() : SP_OK;
  }

 private:
  // Polls for up to `spin` for the operation to end, yielding the core to
  // whatever else is runnable on it (the worker, the transport's thread).
  // Sleeping at once lets an idle core halt, and on a virtual machine waking
  // a halted vCPU for the peer's message costs the host's scheduling delay,
  // up to a tick; a waiter that keeps its core busy receives the wake-up of
  // its transport thread at once (docs/BENCHMARKS.md, issue 38).
  void spin_first(std::chrono::microseconds spin) const {
    if (spin.count() <= 0 || ended_.load(std::memory_order_acquire)) return;
    const auto until = Clock::now() + spin;
    do std::this_thread::yield();
    while (!ended_.load(std::memory_order_acquire) && Clock::now() < until);
  }

  // SP_ERR_TIMEOUT, the message in last_error(), when the watch finds the
  // worker stuck; `lock` (on mu_) is let go meanwhile.
  int stuck(std::unique_lock<std::mutex>& lock) {
    if (!watch_) return SP_OK;
    lock.unlock();
    const std::string why = watch_->check();
    lock.lock();
    if (why.empty() || done_) return SP_OK;
    return fail(SP_ERR_TIMEOUT, what() + ": " + why + "; the communicator is broken now");
  }

  const std::shared_ptr<WorkerWatch> watch_;
  const std::chrono::microseconds spin_;
  std::atomic<bool> ended_{false};  // done_, for spin_first() without the lock
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  Clock::time_point start_;
  bool done_ = false;
  int status_ = SP_OK;
  std::string error_;
};

// sp_work is opaque in the ABI; a plugin built on WorkState hands out this,
// which keeps the state alive until release() however long the operation runs.
struct WorkHandle {
  std::shared_ptr<WorkState> state;
};

inline WorkState* state_of(sp_work* work) {
  auto* h = reinterpret_cast<WorkHandle*>(work);
  return h ? h->state.get() : nullptr;
}

// The ABI's wait, test and release for such a plugin (see WorkState::wait for `engine`).
inline int wait_work(const char* backend, sp_work* work, int64_t timeout_ms, const char* engine) {
  WorkState* st = state_of(work);
  if (!st) return fail(SP_ERR_INVALID, std::string(backend) + " wait: NULL work");
  return st->wait(timeout_ms, engine);
}

inline int test_work(const char* backend, sp_work* work, int32_t* done) {
  WorkState* st = state_of(work);
  if (!st || !done) return fail(SP_ERR_INVALID, std::string(backend) + " test: NULL work or done");
  return st->test(done);
}

inline void release_work(sp_work* work) { delete reinterpret_cast<WorkHandle*>(work); }

// Runs a communicator's operations one at a time, in issue order: inline on
// the caller when nothing is queued or running and the caller waits anyway
// (no thread hop, which is most of a small operation's latency), otherwise on
// a worker thread started by the first operation that needs one. A backend
// can send blocking calls to the worker as well (set_blocking_inline(false)):
// gloo does, see plugins/comm_gloo/comm.h. Running
// operations one after another, rather than only completing them in order,
// lets an async operation read a buffer an earlier one writes.
//
// `Run` is what the plugin needs to run one operation; `execute(run, err)`
// runs it and returns its status, with the message in `err` on failure.
template <class Run>
class InOrderQueue {
 public:
  using Execute = std::function<int(Run& run, std::string& err)>;

  // `worker_setup` runs first thing on the worker thread.
  explicit InOrderQueue(Execute execute, void (*worker_setup)() = nullptr)
      : execute_(std::move(execute)), worker_setup_(worker_setup) {}
  InOrderQueue(const InOrderQueue&) = delete;
  InOrderQueue& operator=(const InOrderQueue&) = delete;
  ~InOrderQueue() { stop(); }

  // false: blocking calls go through the worker like async ones. Set it
  // before the first operation.
  void set_blocking_inline(bool on) { blocking_inline_ = on; }
  bool blocking_inline() const { return blocking_inline_; }

  // How long a wait for an operation on the worker polls before it sleeps
  // (WorkState::spin_first). Set it before the first operation.
  void set_spin_wait(std::chrono::microseconds spin) { spin_ = spin; }
  std::chrono::microseconds spin_wait() const { return spin_; }

  // Bounds every wait on the worker by the communicator's timeout (see
  // WorkerWatch); `on_stuck` must break the communicator. Set it before the
  // first operation; the owner clears it (nullptr) before it goes away.
  void set_stuck_handler(WorkerWatch::Handler on_stuck) { watch_->set_handler(std::move(on_stuck)); }
  // Whether the worker is still in an operation the watch gave up on, after
  // waiting up to `grace` for it to end: joining it could then hang.
  bool stuck_after(std::chrono::milliseconds grace) const {
    const auto until = WorkerWatch::Clock::now() + grace;
    while (watch_->tripped() && watch_->busy()) {
      if (WorkerWatch::Clock::now() >= until) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  // Lets the worker run what is queued, then ends it. The owner calls this
  // before it tears down anything its operations use.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  // The inline path of a blocking call, for any callable: when nothing is
  // queued or running, runs f(err) on the caller and returns true with its
  // status in *status (the message in last_error()). No work record, no
  // std::function, no thread hop: for a small operation those were a
  // measurable part of the call. False: the call must go through submit().
  template <class F>
  bool run_inline(const OpInfo& info, F&& f, int* status) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!queue_.empty() || busy_) return false;
    busy_ = true;
    lock.unlock();
    std::string err;
    *status = f(err);
    lock.lock();
    busy_ = false;
    lock.unlock();
    cv_.notify_all();
    if (*status != SP_OK) last_error() = info.what() + ": " + err;
    return true;
  }

  // Runs `run` as the operation `info`. work == nullptr: returns its status
  // once it has run (the message in last_error()). Otherwise queues it and
  // stores its handle in *work.
  int submit(const OpInfo& info, Run run, sp_work** work) {
    int status;
    if (!work && blocking_inline_ &&
        run_inline(info, [&](std::string& err) { return execute_and_free(run, err); }, &status))
      return status;
    // Unarmed (mpi), waits keep their own bounds.
    auto state = std::make_shared<WorkState>(info, watch_->armed() ? watch_ : nullptr, spin_);
    std::unique_lock<std::mutex> lock(mu_);
    if (!worker_.joinable()) worker_ = std::thread(&InOrderQueue::worker_loop, this);
    queue_.push_back(Task{state, std::move(run)});
    lock.unlock();
    cv_.notify_all();
    if (work) {
      *work = reinterpret_cast<sp_work*>(new WorkHandle{std::move(state)});
      return SP_OK;
    }
    return state->wait_blocking();
  }

 private:
  struct Task {
    std::shared_ptr<WorkState> state;
    Run run;
  };

  int execute_and_free(Run& run, std::string& err) {
    const int status = execute_(run, err);
    run = Run();  // frees the operation's temporaries before anyone is told it is done
    return status;
  }

  void execute(WorkState& state, Run& run) {
    state.start();
    watch_->running(state.info);
    std::string err;
    const int status = execute_and_free(run, err);
    watch_->idle();
    state.finish(status, std::move(err));
  }

  void worker_loop() {
    if (worker_setup_) worker_setup_();
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || (!queue_.empty() && !busy_); });
      if (queue_.empty() || busy_) {
        if (stopping_ && queue_.empty()) return;
        continue;
      }
      Task task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      execute(*task.state, task.run);
      task = Task{};
      lock.lock();
      busy_ = false;
    }
  }

  const Execute execute_;
  void (*const worker_setup_)();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  bool blocking_inline_ = true;
  std::chrono::microseconds spin_{0};
  const std::shared_ptr<WorkerWatch> watch_ = std::make_shared<WorkerWatch>();
  std::thread worker_;
};

}  // namespace comm
}  // namespace shardplan

#pragma GCC visibility pop
