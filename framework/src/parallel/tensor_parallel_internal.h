#pragma once
// What the TensorParallel sources share (tensor_parallel.cpp: construction;
// tensor_parallel_runtime.cpp: the rank threads; tensor_parallel_autograd.cpp:
// forward and backward; tensor_parallel_state.cpp: state_dict). Not installed.
#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shardplan/tensor_parallel.h"
#include "shardplan/world.h"

namespace shardplan {

namespace tp_detail {

// One thread per rank, alive as long as the wrapper: a rank's World, its
// RNG tracker (thread-local) and its communicators belong to its thread, and
// every job (set up, forward, backward) must reach all ranks at once.
class Workers {
 public:
  explicit Workers(int n);
  ~Workers();

  // Runs job(rank) on every worker and waits for all. The first job to throw
  // calls on_failure (which aborts the communicators, so ranks waiting for
  // the failed one in a collective fail too instead of hanging); its error
  // is rethrown here naming its rank.
  void run(const std::function<void(int)>& job, const std::function<void()>& on_failure);

 private:
  void loop(int r);

  const int n_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  std::function<void(int)> job_;
  std::function<void()> on_failure_;
  int pending_ = 0;
  std::exception_ptr first_error_;
  int failed_rank_ = -1;
};

// Where every element of a replica's parameter comes from in the full one.
//
// The plugins know how they shard (contiguous or uneven chunks, `blocks: k`,
// gate-aware LSTM splits, ...), and a checkpoint needs exactly that
// knowledge backwards. Instead of re-deriving it from the report's layout
// strings for each plugin, the wrapper asks the plugins themselves once: it
// shards one more clone per rank whose parameters hold 1 + their flat index
// (float64 is exact up to 2^53 elements) and reads back which full-tensor
// element each shard element is. Any plugin that slices gets state_dict()
// and load_state_dict() for free; one that computed values from several
// elements would be caught (non-integral or missing indices).
struct ParamSlot {
  std::string name;                    // original path, "fc1.weight"
  std::vector<int64_t> global_shape;
  bool whole = true;                   // every rank holds the full tensor
  std::vector<at::Tensor> index;       // per rank, when !whole: flat index + 1 (0: not from the full tensor)
  std::vector<int> holder;             // per rank: the rank whose copy stands for it (itself when exposed)
  std::vector<at::Tensor> tensor;      // per rank: the replica's parameter
  bool exposed_elsewhere = false;      // a tied parameter already exposed under another name
};

// dict[name], or an error naming the rank whose replica lacks it.
at::Tensor find_named(const torch::OrderedDict<std::string, at::Tensor>& dict, const std::string& name,
                      const char* what, int rank);

}  // namespace tp_detail

struct TensorParallelImpl::Runtime {
  int n = 0;
  std::vector<std::string> devices;
  ReplicaForward forward_fn;
  std::shared_ptr<torch::nn::Module> prototype;  // the caller's model: structure for save()/load()
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  std::vector<ParallelReport> reports;
  std::vector<tp_detail::ParamSlot> params;
  std::vector<std::string> buffer_names;

  std::mutex worlds_mu;
  std::vector<std::shared_ptr<World>> worlds;

  std::mutex call_mu;  // one job at a time; also keeps state_dict() off a running step
  std::string broken;  // set by the first failure
  at::Tensor anchor;   // makes the output require grad when only the replicas' parameters do

  // Declared last: destroyed first, so the threads are gone before what
  // they use.
  std::unique_ptr<tp_detail::Workers> workers;

  void abort_all();
  void run(const std::function<void(int)>& job);
  void sync_replicated(int r);
};

}  // namespace shardplan
