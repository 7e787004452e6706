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
#include <memory>
#include <string>
#include <utility>

#include "context.h"
#include "errors.h"
#include "rendezvous.h"
#include "self_mailbox.h"
#include "shm.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_plugin.h"

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
  }

  ~Comm() { queue_.stop(); }

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
  // link_gbps=X / SHARDPLAN_GLOO_LINK_GBPS: an emulated link of X Gbit/s
  // (0: none), this communicator's and its splits' (link.h).
  double link_bytes_per_second = 0;
  std::shared_ptr<ShmGroup> shm;      // set when its ranks share a host (shm.h)

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
  template <class F>
  int submit(const char* op, F&& run, sp_work** work) {
    const shardplan::comm::OpInfo info{"gloo", op, rank, size, timeout};
    int status;
    if (!work && queue_.blocking_inline() &&
        queue_.run_inline(info, [&](std::string& err) { return execute(run, err); }, &status))
      return status;
    return queue_.submit(info, std::function<void()>(std::forward<F>(run)), work);
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
      err = "the communicator was aborted";
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
    } catch (const std::exception& e) {
      status = SP_ERR_INTERNAL;
      err = clean(e.what());
    } catch (...) {
      status = SP_ERR_INTERNAL;
      err = "unknown error";
    }
    if (status != SP_OK && aborted) {
      status = SP_ERR_ABORTED;
      err = "the communicator was aborted (" + err + ")";
    }
    return status;
  }

  // SIGPIPE stays blocked for good on the worker, which only ever runs gloo.
  static void block_sigpipe() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  }

  uint32_t tag_ = 0;
  shardplan::comm::InOrderQueue<std::function<void()>> queue_{
      [this](std::function<void()>& run, std::string& err) { return execute(run, err); }, &block_sigpipe};
};

}  // namespace sp_gloo
