#pragma once
// One communicator: its gloo context, the in-order queue its operations run
// through, and its split children.
#include <gloo/common/error.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/device.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "context.h"
#include "errors.h"
#include "rendezvous.h"
#include "self_mailbox.h"
#include "shm.h"
#include "tcp_all_reduce.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_plugin.h"
#include "shardplan/comm_worker.h"

namespace sp_gloo {
class Comm;
}  // namespace sp_gloo

struct sp_comm {
  std::shared_ptr<sp_gloo::Comm> impl;
};

namespace sp_gloo {

using ms = std::chrono::milliseconds;

class Comm {
 public:
  // blocking_inline: whether a blocking call with nothing queued runs on the
  // caller's thread rather than the communicator's worker (see submit()).
  Comm(int rank, int size, ms timeout, std::shared_ptr<KeyStore> store, std::string prefix,
       std::shared_ptr<gloo::transport::Device> device, bool blocking_inline)
      : rank(rank), size(size), timeout(timeout), store(std::move(store)), prefix(std::move(prefix)),
        device(std::move(device)) {
    queue_.set_blocking_inline(blocking_inline);
    queue_.set_stuck_handler([this](const std::string& why) { break_with(why); });
  }

  ~Comm() {
    queue_.set_stuck_handler(nullptr);
    queue_.stop();
  }

  const int rank;
  const int size;
  const ms timeout;
  const std::shared_ptr<KeyStore> store;  // shared by every split of one root
  const std::string prefix;               // this communicator's keys in `store`
  const std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<Context> ctx;
  std::atomic<bool> aborted{false};
  uint32_t split_seq = 0;  // advanced by the executing thread only
  SelfMailbox self;
  ShmMode shm_mode = ShmMode::kAuto;  // this communicator's and its splits'
  TcpAllReduce tcp_all_reduce = TcpAllReduce::kAuto;  // likewise (tcp_all_reduce.h)
  // The peer's buffer in pairwise_all_reduce, kept between calls (used by
  // the executing thread only): a fresh one would page-fault on every call.
  std::vector<uint8_t> pair_scratch;
  // link_gbps=X / SHARDPLAN_GLOO_LINK_GBPS: an emulated link of X Gbit/s
  // (0: none), this communicator's and its splits' (link.h).
  double link_bytes_per_second = 0;
  std::shared_ptr<ShmGroup> shm;      // set when its ranks share a host (shm.h)
  // Runs `run` on the calling thread at once, whatever is queued ahead: for
  // a blocking receive already posted, whose wait needs its own message
  // only. Queued, it would first wait for this rank's earlier sends to be
  // taken, which may need the peer to get further first: two ranks that
  // send to each other and then receive (an interleaved pipeline's chunks,
  // shardplan/pipeline.h) would each wait for the other.
  template <class F>
  int run_now(const char* op, F&& run) {
    std::string err;
    const int status = execute(run, err);
    if (status != SP_OK)
      shardplan::comm::last_error() = shardplan::comm::OpInfo{"gloo", op, rank, size, timeout}.what() + ": " + err;
    return status;
  }

  // Test hook SHARDPLAN_TEST_GLOO_STALL_MS (env.h), this communicator's and its splits'.
  long test_stall_ms = 0;
  bool verbose = false;  // SHARDPLAN_GLOO_VERBOSE, this communicator's and its splits'
  // Each root rank's address (gathered once by the root communicator) and the
  // root rank of each of this communicator's ranks: a timeout cannot tell
  // which peer failed (gloo does not say which pair an operation waits on),
  // so it names the group's other hosts, which points at the link.
  std::shared_ptr<const std::vector<std::string>> hosts;
  std::vector<int> root_ranks;

  // `cancel`: the abort flag of whoever else is waiting for this connect
  // (the parent of a split).
  void connect(const std::atomic<bool>* cancel = nullptr) {
    ctx = std::make_shared<Context>(rank, size);
    ctx->setTimeout(timeout);
    auto dev = device;
    if (cancel) {
      InterruptibleStore interruptible(*store, *cancel, timeout);
      gloo::rendezvous::PrefixStore ps(prefix, interruptible);
      ctx->connectFullMesh(ps, dev);
    } else {
      gloo::rendezvous::PrefixStore ps(prefix, *store);
      ctx->connectFullMesh(ps, dev);
    }
  }

  uint32_t next_tag() { return tag_++; }

  std::string what(const char* op) const {
    return std::string(op) + " on rank " + std::to_string(rank) + " of " + std::to_string(size);
  }

  bool blocking_inline() const { return queue_.blocking_inline(); }

  // spin_us= / SHARDPLAN_GLOO_SPIN_US, this communicator's and its splits'
  // (set before the first operation).
  void set_spin_wait(std::chrono::microseconds spin) { queue_.set_spin_wait(spin); }
  std::chrono::microseconds spin_wait() const { return queue_.spin_wait(); }

  // Runs `run` in issue order. work == nullptr: blocks and returns its status.
  //
  // By default a blocking call, too, runs on the worker, as ProcessGroupGloo
  // runs it on its own threads. Inline on a training thread it was slower
  // (train_gpt over 2 processes, docs/BENCHMARKS.md): gloo's network thread
  // only handles a pair's socket when it can take the pair's lock, and
  // otherwise polls again at once; the training thread, having used up its
  // share of the core, is preempted while holding that lock whenever the
  // network thread wakes, and the network thread then spins until the
  // scheduler gives the core back. A worker that mostly sleeps is not
  // preempted that way. gloo's per-call scratch also stays out of the
  // training thread's malloc arena.
  //
  // No wait for the worker is unbounded: once the worker has spent the
  // timeout plus a margin in one operation (WorkerWatch, comm_worker.h), a
  // waiting call fails with a timeout naming the operation and the limit,
  // and the communicator is broken: aborted, so that what the worker waits
  // in wakes and later calls fail at once. Buffers of an operation still on
  // the worker stay in use until it ends. destroy() keeps a communicator
  // whose worker does not come back instead of joining it (comm_gloo.cpp).
  // Inline (blocking=inline) the caller runs the operation itself, so only
  // the operation's own bounds apply.
  template <class F>
  int submit(const char* op, F&& run, sp_work** work) {
    const shardplan::comm::OpInfo info{"gloo", op, rank, size, timeout};
    int status;
    if (!work && queue_.blocking_inline() &&
        queue_.run_inline(info, [&](std::string& err) { return execute(run, err); }, &status))
      return status;
    return queue_.submit(info, std::function<void()>(std::forward<F>(run)), work);
  }

  // Why calls are refused once it is aborted: by the user, or broken by a
  // wait that gave up on a stuck worker.
  std::string refusal() const {
    if (!broken_.load()) return "the communicator was aborted";
    return "the communicator is broken (" + broken_why_ + ")";
  }

  // Whether the worker is still inside an operation a wait gave up on, a
  // second after that: destroying the communicator would join it forever.
  bool worker_stuck() const { return queue_.stuck_after(ms(1000)); }

  // Test hook SHARDPLAN_TEST_GLOO_STALL_MS: the worker sleeps that long at
  // the start of each collective, deaf to abort, as a transport that never
  // answers would; it then gives up if the communicator was broken meanwhile.
  void test_stall() const {
    if (test_stall_ms <= 0) return;
    std::this_thread::sleep_for(ms(test_stall_ms));
    if (aborted) throw RendezvousError(refusal(), SP_ERR_ABORTED);
  }

  void abort() {
    aborted = true;
    if (ctx) ctx->abort("communicator aborted");
    if (shm) shm->leave();
    self.wake();
    children.abort_all();
  }

  shardplan::comm::Children<Comm> children;

 private:
  template <class F>
  int execute(F& run, std::string& err) {
    if (aborted) {
      err = refusal();
      return SP_ERR_ABORTED;
    }
    int status = SP_OK;
    try {
      run();
    } catch (const RendezvousError& e) {
      status = e.status();
      err = clean(e.what());
    } catch (const gloo::IoException& e) {
      err = clean(e.what());
      status = mentions_timeout(err) ? SP_ERR_TIMEOUT : SP_ERR_INTERNAL;
      if (status == SP_ERR_TIMEOUT) err += other_hosts();
    } catch (const std::exception& e) {
      status = SP_ERR_INTERNAL;
      err = clean(e.what());
    } catch (...) {
      status = SP_ERR_INTERNAL;
      err = "unknown error";
    }
    if (status != SP_OK && aborted) {
      status = SP_ERR_ABORTED;
      err = refusal() + " (" + err + ")";
    }
    return status;
  }

  // "; the group's ranks on other hosts: 10.0.0.2 (2, 3)", or "".
  std::string other_hosts() const {
    if (!hosts || root_ranks.size() != static_cast<size_t>(size)) return "";
    const std::string& mine = hosts->at(static_cast<size_t>(root_ranks[rank]));
    std::map<std::string, std::string> ranks_on;
    for (int m = 0; m < size; ++m) {
      const std::string& h = hosts->at(static_cast<size_t>(root_ranks[m]));
      if (h == mine) continue;
      std::string& list = ranks_on[h];
      list += (list.empty() ? "" : ", ") + std::to_string(m);
    }
    std::string out;
    for (const auto& [host, list] : ranks_on) out += (out.empty() ? "" : ", ") + host + " (" + list + ")";
    return out.empty() ? out : "; the group's ranks on other hosts: " + out;
  }

  // SIGPIPE stays blocked for good on the worker, which only ever runs gloo.
  static void block_sigpipe() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  }

  // Called by the queue's watch (under its lock, once): later calls fail at
  // once, and aborting wakes whatever the worker waits in that can be woken.
  void break_with(const std::string& why) {
    broken_why_ = why;
    broken_.store(true);
    abort();
  }

  uint32_t tag_ = 0;
  std::string broken_why_;  // written once, before broken_
  std::atomic<bool> broken_{false};
  shardplan::comm::InOrderQueue<std::function<void()>> queue_{
      [this](std::function<void()>& run, std::string& err) { return execute(run, err); }, &block_sigpipe};
};

}  // namespace sp_gloo
