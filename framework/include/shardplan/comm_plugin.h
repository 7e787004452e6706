// What the communication plugins do alike, written once: the per-thread
// error message behind last_error(), the checks create() starts with,
// buffer validation, passing an abort on to split communicators, and the
// entry point with its sp_comm_api table (SHARDPLAN_COMM_PLUGIN). For backends
// whose operations run to completion on a thread (gloo, mpi) also the state
// of one operation, the ABI's wait/test/release on it, and the queue that runs
// a communicator's operations in issue order. What belongs to one transport
// (MPI's request polling, NCCL's streams and events, gloo's pairs and
// signals, the local backend's shared-memory protocol) stays in its plugin.
//
// Header-only, C++17 and free of torch and of any transport library, like
// comm_dtype.h: a comm plugin still links nothing but shardplan::abi and its
// transport, and the comm ABI is untouched. Everything here is hidden (as
// shardplan_add_plugin builds plugins anyway), so each loaded plugin keeps its
// own copy, the per-thread error message included, and plugins built from
// different versions of this header never bind to each other's.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "shardplan/abi/comm.h"
#include "shardplan/abi/plugin.h"
#include "shardplan/comm_dtype.h"

#pragma GCC visibility push(hidden)

namespace shardplan {
namespace comm {

// ------------------------------------------------------------------ errors

// The message of this thread's latest failure: what last_error() returns.
inline std::string& last_error() {
  static thread_local std::string message;
  return message;
}

// Records `message` for last_error() and returns `status`.
inline int fail(int status, std::string message) {
  last_error() = std::move(message);
  return status;
}

inline const char* api_last_error() { return last_error().c_str(); }

// ------------------------------------------------------------------ create

constexpr int64_t kDefaultTimeoutMs = 5 * 60 * 1000;

// The checks every create() starts with; clears *out first. Messages read
// "<backend> create: ...".
inline int check_create(const char* backend, const sp_comm_config* config, sp_comm** out) {
  auto bad = [&](const std::string& why) { return fail(SP_ERR_INVALID, std::string(backend) + " create: " + why); };
  if (!out) return bad("out is NULL");
  *out = nullptr;
  if (!config || config->struct_size < sizeof(sp_comm_config)) return bad("config is NULL or from an older ABI");
  if (config->world_size < 1 || config->rank < 0 || config->rank >= config->world_size)
    return bad("rank " + std::to_string(config->rank) + " of world size " + std::to_string(config->world_size));
  return SP_OK;
}

// Calls f(key, value) for each "key=value" of a config's NULL-terminated
// options ("key" alone has an empty value). A backend skips the keys it does
// not know: they are meant for another backend or for the framework.
template <class F>
void for_each_option(const char* const* options, F&& f) {
  for (auto p = options; p && *p; ++p) {
    const std::string kv(*p);
    const auto eq = kv.find('=');
    f(kv.substr(0, eq), eq == std::string::npos ? std::string() : kv.substr(eq + 1));
  }
}

// The communicator's timeout: every blocking step gives up after it.
inline std::chrono::milliseconds timeout_of(const sp_comm_config& config) {
  return std::chrono::milliseconds(config.timeout_ms > 0 ? config.timeout_ms : kDefaultTimeoutMs);
}

// ----------------------------------------------------------------- buffers

// Whether the byte ranges [a, a + an) and [b, b + bn) share a byte.
inline bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return an && bn && pa < pb + bn && pb < pa + an;
}

// One buffer of a backend that moves memory of `device_type` only: NULL, an
// unknown dtype, the other device (`elsewhere` ends that message: "is a CUDA
// buffer; ..."), an unknown device, or elements without data. Messages read
// "<context()>: <which> ..."; context() is called on failure only, so the
// checks cost no allocation on the hot path.
template <class Context>
int check_device_buffer(int32_t device_type, const char* elsewhere, const char* which, const sp_buffer* b,
                        Context&& context) {
  auto bad = [&](int status, const std::string& why) { return fail(status, context() + ": " + which + " " + why); };
  if (!b) return bad(SP_ERR_INVALID, "buffer is NULL");
  if (dtype_size(b->dtype) == 0) return bad(SP_ERR_INVALID, "has unknown dtype " + std::to_string(b->dtype));
  if (b->device_type != device_type) {
    const bool known = b->device_type == SP_DEVICE_CPU || b->device_type == SP_DEVICE_CUDA;
    return known ? bad(SP_ERR_UNSUPPORTED, elsewhere)
                 : bad(SP_ERR_INVALID, "has unknown device type " + std::to_string(b->device_type));
  }
  if (b->count > 0 && !b->data)
    return bad(SP_ERR_INVALID, "has " + std::to_string(b->count) + " elements but no data");
  return SP_OK;
}

// The same for a backend that moves CPU memory only; messages start "<backend> <op>".
inline int check_cpu_buffer(const char* backend, const char* op, const char* which, const sp_buffer* b) {
  return check_device_buffer(SP_DEVICE_CPU, "is a CUDA buffer; this backend moves CPU memory only", which, b,
                             [&] { return std::string(backend) + " " + op; });
}

// Both buffers of a collective, which must hold the same dtype.
inline int check_cpu_pair(const char* backend, const char* op, const sp_buffer* send, const sp_buffer* recv) {
  if (int rc = check_cpu_buffer(backend, op, "send", send)) return rc;
  if (int rc = check_cpu_buffer(backend, op, "recv", recv)) return rc;
  if (send->dtype != recv->dtype)
    return fail(SP_ERR_INVALID, std::string(backend) + " " + op + ": send is " + dtype_name(send->dtype) +
                                    " but recv is " + dtype_name(recv->dtype));
  return SP_OK;
}

// --------------------------------------------------------- split children

// The communicators split from one. The ABI's abort reaches "the ranks
// sharing its group, where the backend can reach them", and within a process
// a backend can: aborting a communicator aborts the children it split off.
template <class Comm>
class Children {
 public:
  // Adds `child`, split from the communicator whose abort flag is
  // `parent_aborted`. An abort that raced with the split looked for children
  // before this one was added, so it is passed on here.
  void adopt(const std::shared_ptr<Comm>& child, const std::atomic<bool>& parent_aborted) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      children_.erase(std::remove_if(children_.begin(), children_.end(),
                                     [](const std::weak_ptr<Comm>& w) { return w.expired(); }),
                      children_.end());
      children_.push_back(child);
    }
    if (parent_aborted) child->abort();
  }

  // Outside the lock: a child's abort goes on to its own children.
  void abort_all() {
    std::vector<std::shared_ptr<Comm>> alive;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& w : children_)
        if (auto c = w.lock()) alive.push_back(std::move(c));
    }
    for (auto& c : alive) c->abort();
  }

 private:
  std::mutex mu_;
  std::vector<std::weak_ptr<Comm>> children_;
};

// ------------------------------------------- operations run on a thread

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

  explicit WorkState(const OpInfo& info, std::shared_ptr<WorkerWatch> watch = nullptr)
      : info(info), watch_(std::move(watch)) {}
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
    cv_.notify_all();
  }

  // For a blocking call: the operation gives up after the communicator's
  // timeout by itself; with a watch, the wait also ends when the worker is
  // stuck past it (in this operation or one queued before it).
  int wait_blocking() {
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
    auto state = std::make_shared<WorkState>(info, watch_->armed() ? watch_ : nullptr);
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
  const std::shared_ptr<WorkerWatch> watch_ = std::make_shared<WorkerWatch>();
  std::thread worker_;
};

}  // namespace comm
}  // namespace shardplan

#pragma GCC visibility pop

// Defines the entry point of a communication plugin whose ABI functions are
// ns::api_create, ns::api_split, ... ns::api_release (every field of
// sp_comm_api after `caps` but last_error, which comes from above); `version`
// is sp_plugin_info's free text:
//   SHARDPLAN_COMM_PLUGIN(sp_mpi, "mpi", SP_CAP_CPU | SP_CAP_PROCESS_RANKS, "shardplan mpi plugin 0.1")
// The table is filled field by field, so a plugin lacking a function does not
// compile and none can land in another's slot.
#define SHARDPLAN_COMM_PLUGIN(ns, plugin_name, capabilities, version)                                    \
  extern "C" SP_PLUGIN_EXPORT const sp_plugin_info* shardplan_plugin_entry(void) {                       \
    static const sp_plugin_info info = {                                                                 \
        SP_PLUGIN_ENTRY_VERSION, SP_PLUGIN_COMM, SP_COMM_ABI_VERSION, plugin_name, version,              \
        []() -> const void* {                                                                            \
          static const sp_comm_api api = [] {                                                            \
            sp_comm_api a{};                                                                             \
            a.abi_version = SP_COMM_ABI_VERSION;                                                         \
            a.struct_size = sizeof(sp_comm_api);                                                         \
            a.name = plugin_name;                                                                        \
            a.caps = capabilities;                                                                       \
            a.last_error = &::shardplan::comm::api_last_error;                                           \
            a.create = &ns::api_create;                                                                  \
            a.split = &ns::api_split;                                                                    \
            a.abort = &ns::api_abort;                                                                    \
            a.destroy = &ns::api_destroy;                                                                \
            a.rank = &ns::api_rank;                                                                      \
            a.size = &ns::api_size;                                                                      \
            a.all_reduce = &ns::api_all_reduce;                                                          \
            a.all_gather = &ns::api_all_gather;                                                          \
            a.reduce_scatter = &ns::api_reduce_scatter;                                                  \
            a.broadcast = &ns::api_broadcast;                                                            \
            a.scatter = &ns::api_scatter;                                                                \
            a.gather = &ns::api_gather;                                                                  \
            a.all_to_all = &ns::api_all_to_all;                                                          \
            a.send = &ns::api_send;                                                                      \
            a.recv = &ns::api_recv;                                                                      \
            a.barrier = &ns::api_barrier;                                                                \
            a.wait = &ns::api_wait;                                                                      \
            a.test = &ns::api_test;                                                                      \
            a.release = &ns::api_release;                                                                \
            return a;                                                                                    \
          }();                                                                                           \
          return &api;                                                                                   \
        }};                                                                                              \
    return &info;                                                                                        \
  }
