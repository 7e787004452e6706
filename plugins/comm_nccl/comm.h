#pragma once
// One NCCL communicator: its stream, the order its operations reach the GPU
// in (streams joined, send/recv held back until the next launch), its splits
// and its abort; and the state of one operation, which sp_work holds.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "launch.h"
#include "nccl_support.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_plugin.h"
#include "store.h"

namespace sp_nccl {
class Comm;
struct WorkState;
}  // namespace sp_nccl

struct sp_comm {
  std::shared_ptr<sp_nccl::Comm> impl;
};

struct sp_work {
  std::shared_ptr<sp_nccl::WorkState> state;
};

namespace sp_nccl {

struct WorkState {
  WorkState(std::shared_ptr<Comm> comm, const char* op) : comm(std::move(comm)), op(op) {}
  const std::shared_ptr<Comm> comm;
  const char* const op;  // a string literal
  // Guarded by comm->mu.
  bool pending = false;          // a held-back send/recv, not launched yet
  std::shared_ptr<Event> event;  // set once launched
  Clock::time_point issued;
  bool done = false;
  int status = SP_OK;
  std::string error;

  void finish(int st, std::string err) {
    done = true;
    status = st;
    error = std::move(err);
  }
};

class Comm : public std::enable_shared_from_this<Comm> {
 public:
  Comm(int rank, int size, int device, ms timeout, std::shared_ptr<Store> store, std::string prefix,
       bool split_via_store)
      : rank(rank), size(size), device(device), timeout(timeout), store(std::move(store)), prefix(std::move(prefix)),
        split_via_store(split_via_store) {}

  ~Comm() {
    DeviceGuard g(device);
    if (nccl) ncclCommAbort(nccl);  // only when destroy() never ran
    if (scalar) cudaFree(scalar);
    if (stream) cudaStreamDestroy(stream);
  }

  const int rank;
  const int size;
  const int device;
  const ms timeout;
  const std::shared_ptr<Store> store;  // null for a world of one without a store
  const std::string prefix;            // this communicator's keys in `store`
  const bool split_via_store;
  std::atomic<bool> aborted{false};

  void* barrier_scalar() const { return scalar; }  // set once by init()

  std::string what(const char* op) const {
    return std::string("nccl ") + op + " on rank " + std::to_string(rank) + " of " + std::to_string(size) +
           " (cuda:" + std::to_string(device) + ")";
  }

  // Creates the stream, the barrier's scalar and the NCCL communicator (or
  // adopts `made`, one ncclCommSplit already settled). `cancel`: the parent's
  // abort flag while a split creates this communicator.
  int init(const ncclUniqueId* id, ncclComm_t made, const std::atomic<bool>* cancel, std::string* err);

  // Issues one operation: `issue(launch)` enqueues it on launch.stream and
  // returns NCCL's result. `main`/`other`: the buffers whose streams matter,
  // `other` may be null. work == nullptr: waits for completion.
  template <typename Issue>
  int run(const char* op, const sp_buffer* main, const sp_buffer* other, Issue&& issue, sp_work** work) {
    auto state = std::make_shared<WorkState>(shared_from_this(), op);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted || !nccl) return fail(SP_ERR_ABORTED, what(op) + ": the communicator was aborted");
      DeviceGuard g(device);
      flush_locked();
      Launch l;
      l.nccl = nccl;
      l.stream = main && main->stream ? static_cast<cudaStream_t>(main->stream) : stream;
      cudaStream_t join = other && other->stream ? static_cast<cudaStream_t>(other->stream) : nullptr;
      int rc = SP_OK;
      std::string err;
      if (order_locked(l, join)) {
        ncclResult_t r = issue(l);
        rc = settle(nccl, r, Clock::now() + timeout, aborted, nullptr, &err);
      }
      if (rc == SP_OK && !l.error.empty()) {
        rc = SP_ERR_INTERNAL;
        err = l.error;
      }
      for (void* p : l.scratch) cudaFreeAsync(p, l.stream);
      if (rc == SP_OK) rc = record_locked(l.stream, &state->event, &err);
      if (rc != SP_OK) {
        if (rc == SP_ERR_TIMEOUT) {
          err += " (" + std::to_string(timeout.count()) + " ms); communicator aborted";
          abort_locked();
        }
        return fail(rc, what(op) + ": " + err);
      }
      state->issued = Clock::now();
    }
    return hand_out(state, work);
  }

  // Holds a send/recv back until the next launch (see the top of comm_nccl.cpp).
  int post(bool is_send, const sp_buffer& buf, int peer, ncclDataType_t dt, sp_work** work);

  // A collective over this communicator: ncclCommSplit where NCCL has it,
  // else new unique ids exchanged through the store.
  int split(int32_t color, int32_t key, std::shared_ptr<Comm>* out, std::string* err);

  // A nonblocking ncclCommSplit hands the new communicator over from NCCL's
  // own thread: `*child` stays NULL until the split is complete, and the
  // parent's state alone does not tell when (seen on an H200 with NCCL
  // 2.28.3: the parent read ready while `*child` was still NULL, and the next
  // call on the parent failed as still in progress;
  // tests/comm_nccl/mock_cuda_nccl.cpp plays this back). So this waits for
  // both: the parent no longer in progress and, for a rank with a color, the
  // child handed over and itself ready.
  int settle_split(ncclResult_t r, bool want_child, ncclComm_t* child, Clock::time_point deadline, std::string* err);

  void abort();

  shardplan::comm::Children<Comm> children;

  // The end of the communicator for its owner; works still held stay valid.
  void destroy();

  // One look at `st`; true when it has finished (its status is then final).
  bool poll(WorkState& st);

 private:
  struct P2P {
    bool is_send;
    void* data;
    uint64_t count;
    ncclDataType_t dt;
    int peer;
    cudaStream_t stream;
    std::shared_ptr<WorkState> state;
  };

  int hand_out(const std::shared_ptr<WorkState>& state, sp_work** work);

  // Makes l.stream wait for the previous operation (when it ran on another
  // stream) and for `join`. False with l.error set on a CUDA failure.
  bool order_locked(Launch& l, cudaStream_t join);

  int record_locked(cudaStream_t s, std::shared_ptr<Event>* out, std::string* err);

  // Launches the held-back send/recvs as one group on the first one's stream
  // (the others' streams are joined before and wait for it after).
  void flush_locked();

  void abort_locked();

  int split_through_store(uint32_t seq, int32_t color, int32_t key, const std::string& child_prefix,
                          std::shared_ptr<Comm>* out, std::string* err);

  std::mutex mu_;  // held only for short, nonblocking NCCL and CUDA calls
  ncclComm_t nccl = nullptr;
  cudaStream_t stream = nullptr;  // the communicator's own
  void* scalar = nullptr;         // the barrier's one element
  std::shared_ptr<Event> last_;   // completion of the latest launch
  cudaStream_t last_stream_ = nullptr;
  std::vector<P2P> pending_;
  uint32_t split_seq_ = 0;
  // Where ncclCommSplit's thread hands the new communicator over: a member,
  // not split()'s local, since a split that timed out may still write it.
  ncclComm_t split_slot_ = nullptr;
};

// `st`'s status; where it failed, its message becomes this thread's last error.
int report(const WorkState& st);

// timeout_ms < 0: until done, bounded by the communicator's own timeout
// (poll() aborts past it).
int wait_state(WorkState& st, int64_t timeout_ms);

}  // namespace sp_nccl
