// Comm's work outside a split: creating its NCCL communicator, holding
// send/recv back and launching them as one group, ordering its streams,
// polling an operation, destroy and abort.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm.h"
#include "launch.h"
#include "nccl_support.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_plugin.h"

namespace sp_nccl {

int Comm::init(const ncclUniqueId* id, ncclComm_t made, const std::atomic<bool>* cancel, std::string* err) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceGuard g(device);
  Launch l;
  // A blocking stream (not cudaStreamNonBlocking) on purpose: callers that
  // pass no stream typically produced the data on the legacy default
  // stream, with which such a stream is implicitly ordered.
  if (!l.cuda(cudaStreamCreateWithFlags(&stream, cudaStreamDefault), "cudaStreamCreate") ||
      !l.cuda(cudaMalloc(&scalar, sizeof(float)), "cudaMalloc") ||
      !l.cuda(cudaMemset(scalar, 0, sizeof(float)), "cudaMemset")) {
    if (made) ncclCommAbort(made);
    *err = l.error;
    return SP_ERR_INTERNAL;
  }
  if (made) {
    nccl = made;
    return SP_OK;
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&nccl, size, *id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    *err = "ncclCommInitRankConfig: " + nccl_msg(nccl, r);
    if (nccl) ncclCommAbort(nccl);
    nccl = nullptr;
    return status_of(r);
  }
  int rc = settle(nccl, r, Clock::now() + timeout, aborted, cancel, err);
  if (rc != SP_OK) {
    *err = "ncclCommInitRankConfig: " + *err;
    if (rc == SP_ERR_TIMEOUT)
      *err += " (" + std::to_string(timeout.count()) + " ms; did every rank of the group start?)";
    ncclCommAbort(nccl);
    nccl = nullptr;
  }
  return rc;
}

int Comm::post(bool is_send, const sp_buffer& buf, int peer, ncclDataType_t dt, sp_work** work) {
  const char* op = is_send ? "send" : "recv";
  auto state = std::make_shared<WorkState>(shared_from_this(), op);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted || !nccl) return fail(SP_ERR_ABORTED, what(op) + ": the communicator was aborted");
    state->pending = true;
    pending_.push_back(P2P{is_send, buf.data, buf.count, dt, peer,
                           buf.stream ? static_cast<cudaStream_t>(buf.stream) : stream, state});
    if (!work) {
      DeviceGuard g(device);
      flush_locked();
    }
  }
  return hand_out(state, work);
}

void Comm::abort() {
  // Before the lock: whoever holds it is polling NCCL and gives up on this.
  aborted = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort_locked();
  }
  children.abort_all();
}

void Comm::destroy() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : pending_)
    p.state->finish(SP_ERR_ABORTED, "the communicator was destroyed before this operation was launched");
  pending_.clear();
  if (!nccl) return;
  DeviceGuard g(device);
  // Finalize completes what was issued; it only hangs on a peer that is
  // gone, and then abort is the only way out.
  std::string err;
  int rc = settle(nccl, ncclCommFinalize(nccl), Clock::now() + timeout, aborted, nullptr, &err);
  if (rc == SP_OK) ncclCommDestroy(nccl);
  else ncclCommAbort(nccl);
  nccl = nullptr;
}

bool Comm::poll(WorkState& st) {
  std::lock_guard<std::mutex> lock(mu_);
  if (st.done) return true;
  DeviceGuard g(device);
  if (st.pending) flush_locked();
  if (st.done) return true;
  if (aborted) {
    st.finish(SP_ERR_ABORTED, "the communicator was aborted");
    return true;
  }
  cudaError_t q = cudaEventQuery(st.event->ev);
  if (q == cudaSuccess) {
    st.finish(SP_OK, {});
    return true;
  }
  if (q != cudaErrorNotReady) {
    st.finish(SP_ERR_INTERNAL, "CUDA reports " + cuda_msg(q));
    return true;
  }
  ncclResult_t async = ncclSuccess;
  if (nccl && ncclCommGetAsyncError(nccl, &async) == ncclSuccess && async != ncclSuccess &&
      async != ncclInProgress) {
    st.finish(SP_ERR_INTERNAL, nccl_msg(nccl, async) + "; communicator aborted");
    abort_locked();
    return true;
  }
  // NCCL kernels cannot be cancelled one by one: past the communicator's
  // timeout the only way to free the GPU is to abort the communicator.
  if (Clock::now() - st.issued > timeout) {
    st.finish(SP_ERR_TIMEOUT, "not finished " + std::to_string(timeout.count()) +
                                  " ms after it was issued (the communicator's timeout); communicator aborted");
    abort_locked();
    return true;
  }
  return false;
}

bool Comm::order_locked(Launch& l, cudaStream_t join) {
  if (last_ && last_stream_ != l.stream &&
      !l.cuda(cudaStreamWaitEvent(l.stream, last_->ev, 0), "cudaStreamWaitEvent"))
    return false;
  if (join && join != l.stream) {
    cudaEvent_t ev = nullptr;
    bool ok = l.cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate") &&
              l.cuda(cudaEventRecord(ev, join), "cudaEventRecord") &&
              l.cuda(cudaStreamWaitEvent(l.stream, ev, 0), "cudaStreamWaitEvent");
    if (ev) cudaEventDestroy(ev);  // the wait is already enqueued
    return ok;
  }
  return true;
}

int Comm::record_locked(cudaStream_t s, std::shared_ptr<Event>* out, std::string* err) {
  auto ev = std::make_shared<Event>(device);
  cudaError_t e = cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(ev->ev, s);
  if (e != cudaSuccess) {
    *err = "cannot record a CUDA event: " + cuda_msg(e);
    return SP_ERR_INTERNAL;
  }
  last_ = ev;
  last_stream_ = s;
  *out = std::move(ev);
  return SP_OK;
}

void Comm::flush_locked() {
  if (pending_.empty()) return;
  std::vector<P2P> ops;
  ops.swap(pending_);
  int rc = SP_OK;
  std::string err;
  std::shared_ptr<Event> ev;
  if (aborted || !nccl) {
    rc = SP_ERR_ABORTED;
    err = "the communicator was aborted";
  } else {
    Launch l;
    l.stream = ops.front().stream;
    std::vector<cudaStream_t> others;
    for (const auto& p : ops)
      if (p.stream != l.stream && std::find(others.begin(), others.end(), p.stream) == others.end())
        others.push_back(p.stream);
    bool ok = order_locked(l, nullptr);
    for (size_t i = 0; ok && i < others.size(); ++i) ok = order_locked(l, others[i]);
    if (ok) {
      ncclResult_t r = grouped([&] {
        for (const auto& p : ops) {
          if (p.count == 0) continue;
          ncclResult_t x = p.is_send ? ncclSend(p.data, p.count, p.dt, p.peer, nccl, l.stream)
                                     : ncclRecv(p.data, p.count, p.dt, p.peer, nccl, l.stream);
          if (x != ncclSuccess) return x;
        }
        return ncclSuccess;
      });
      rc = settle(nccl, r, Clock::now() + timeout, aborted, nullptr, &err);
    } else {
      rc = SP_ERR_INTERNAL;
      err = l.error;
    }
    if (rc == SP_OK) rc = record_locked(l.stream, &ev, &err);
    for (cudaStream_t s : others)
      if (rc == SP_OK && !l.cuda(cudaStreamWaitEvent(s, ev->ev, 0), "cudaStreamWaitEvent")) {
        rc = SP_ERR_INTERNAL;
        err = l.error;
      }
    if (rc == SP_ERR_TIMEOUT) {
      err += " (" + std::to_string(timeout.count()) + " ms); communicator aborted";
      abort_locked();
    }
  }
  const auto now = Clock::now();
  for (auto& p : ops) {
    p.state->pending = false;
    if (rc == SP_OK) {
      p.state->event = ev;
      p.state->issued = now;
    } else {
      p.state->finish(rc, err);
    }
  }
}

void Comm::abort_locked() {
  aborted = true;
  for (auto& p : pending_) p.state->finish(SP_ERR_ABORTED, "the communicator was aborted");
  pending_.clear();
  if (nccl) {
    DeviceGuard g(device);
    ncclCommAbort(nccl);
    nccl = nullptr;
  }
}

int report(const WorkState& st) {
  if (st.status != SP_OK) shardplan::comm::last_error() = st.comm->what(st.op) + ": " + st.error;
  return st.status;
}

int wait_state(WorkState& st, int64_t timeout_ms) {
  const auto deadline = timeout_ms >= 0 ? Clock::now() + ms(timeout_ms) : Clock::time_point::max();
  Backoff backoff;
  while (!st.comm->poll(st)) {
    if (Clock::now() >= deadline)
      return fail(SP_ERR_TIMEOUT, st.comm->what(st.op) + ": not finished after " + std::to_string(timeout_ms) + " ms");
    backoff.pause();
  }
  return report(st);
}

int Comm::hand_out(const std::shared_ptr<WorkState>& state, sp_work** work) {
  if (work) {
    *work = new sp_work{state};
    return SP_OK;
  }
  return wait_state(*state, -1);
}

}  // namespace sp_nccl
