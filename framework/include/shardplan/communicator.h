#pragma once
// Tensor-level view of one communication group (the world, or a mesh axis).
// Wraps a communication plugin's C ABI for at::Tensor, checks shapes, counts
// the bytes it moves, and turns backend failures into CommError naming the
// collective and the group.
#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardplan/abi/comm.h"

namespace shardplan {

// The per-call trace (SHARDPLAN_COMM_TRACE, World::trace_step); null when off.
class CommTrace;
struct TracedCall;

enum class ReduceOp { Sum = SP_SUM, Max = SP_MAX, Min = SP_MIN, Product = SP_PROD };

// Handle of an asynchronous collective. Keeps its tensors alive until waited.
class Work {
 public:
  Work(const sp_comm_api* api, sp_work* work, std::string what, std::vector<at::Tensor> keep,
       std::chrono::milliseconds timeout);
  ~Work();
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  // Throws CommError on failure or when `timeout` (default: the group's) passes.
  void wait();
  void wait(std::chrono::milliseconds timeout);
  bool done();
  // Records this call in `trace` when it completes (Communicator does it).
  void trace(std::shared_ptr<CommTrace> trace, std::unique_ptr<TracedCall> call);

 private:
  void traced_done(double t_wait_begin);

  const sp_comm_api* api_;
  sp_work* work_;
  std::string what_;
  std::vector<at::Tensor> keep_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<CommTrace> trace_;
  std::unique_ptr<TracedCall> traced_;
};

// Bytes are payload bytes this rank hands to the backend per call (the input
// buffer's size), the quantity a plan's communication volume is stated in.
struct CommStats {
  uint64_t calls = 0;
  uint64_t bytes = 0;
};

class Communicator {
 public:
  // Takes ownership of `comm`. `ranks` are the world ranks of the members, in
  // group-rank order; `name` says which group ("world", "model", ...).
  Communicator(const sp_comm_api* api, sp_comm* comm, std::string name, std::vector<int> ranks,
               std::chrono::milliseconds timeout);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const std::string& backend() const;
  const std::vector<int>& ranks() const { return ranks_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const sp_comm_api* api() const { return api_; }
  sp_comm* raw() const { return comm_; }

  // Collective over this group: members with equal color form a new group,
  // ordered by key. color < 0 returns nullptr.
  std::shared_ptr<Communicator> split(int color, int key, const std::string& name);
  void abort();

  // In place.
  void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::Sum);
  std::unique_ptr<Work> all_reduce_async(at::Tensor& t, ReduceOp op = ReduceOp::Sum);
  // Out of place: the reduction of every rank's `t` in a new contiguous
  // tensor, `t` unchanged. Reducing a copy in place would read and write the
  // bytes once more; the plugins send from `t` and reduce into the result.
  at::Tensor all_reduced(const at::Tensor& t, ReduceOp op = ReduceOp::Sum);
  // Concatenation of every rank's `t` along `dim`, in group-rank order.
  at::Tensor all_gather(const at::Tensor& t, int64_t dim = 0);
  // This rank's chunk (size(dim) / size()) of the elementwise reduction.
  at::Tensor reduce_scatter(const at::Tensor& t, int64_t dim = 0, ReduceOp op = ReduceOp::Sum);
  // Flat forms for data-parallel buckets, asynchronous: `in` and `out`
  // contiguous, in.numel() == size() * out.numel(); rank r's block of the
  // reduction (reduce_scatter) or every rank's `in` concatenated in rank
  // order (all_gather) lands in `out`. nullptr for a group of one (done).
  std::unique_ptr<Work> reduce_scatter_async(const at::Tensor& in, at::Tensor& out, ReduceOp op = ReduceOp::Sum);
  std::unique_ptr<Work> all_gather_async(const at::Tensor& in, at::Tensor& out);
  void broadcast(at::Tensor& t, int root);
  // Root's `t` split along dim 0 into size() chunks; returns this rank's.
  at::Tensor scatter(const at::Tensor& t, int root, const std::vector<int64_t>& chunk_shape);
  // Concatenation along dim 0 at root; an undefined tensor elsewhere.
  at::Tensor gather(const at::Tensor& t, int root);
  // Splits along dim 0 into size() blocks, block j goes to rank j.
  at::Tensor all_to_all(const at::Tensor& t);
  void send(const at::Tensor& t, int peer, int tag = 0);
  void recv(at::Tensor& t, int peer, int tag = 0);
  // Posted at once, completed by Work::wait(): a ring step sends to one
  // neighbour and receives from the other while the caller computes. `t`
  // must be contiguous (recv writes it in place). Messages between two ranks
  // with one tag arrive in the order they were sent.
  std::unique_ptr<Work> send_async(const at::Tensor& t, int peer, int tag = 0);
  std::unique_ptr<Work> recv_async(at::Tensor& t, int peer, int tag = 0);
  void barrier();

  CommStats stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }

  // Every call of this group, and of groups split from it afterwards, goes
  // to `trace` (nullptr: none). init_world sets the world's from
  // SHARDPLAN_COMM_TRACE.
  void set_trace(std::shared_ptr<CommTrace> trace) { trace_ = std::move(trace); }
  CommTrace* trace() const { return trace_.get(); }

  // Raw-buffer helper for code that has no tensor.
  static sp_buffer buffer_of(const at::Tensor& t);

 private:
  void check(int status, const char* collective) const;
  void count(const at::Tensor& t);
  // The trace's record of an asynchronous call issued now (nullptr when
  // off), and its hand-over to the call's Work.
  std::unique_ptr<TracedCall> issue(const char* op, const at::Tensor& t) const;
  std::unique_ptr<Work> traced(std::unique_ptr<Work> w, std::unique_ptr<TracedCall> call) const;

  const sp_comm_api* api_;
  sp_comm* comm_;
  std::string name_;
  std::vector<int> ranks_;
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_;
  CommStats stats_;
  std::shared_ptr<CommTrace> trace_;
};

}  // namespace shardplan
