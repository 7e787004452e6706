#pragma once
// ZeRO-1, the distributed optimizer, over a DataParallel's batch axis:
// gradients are reduce-scattered (at the end of backward), each rank keeps the
// optimizer state of its 1/D slice of every bucket only, updates that slice,
// and the parameters are all-gathered back. Under ZeRO-3 a shardplan::nn
// layer's bucket slice is the only copy of its parameters between uses
// (they hold one NaN each): step() updates it in place and gathers nothing;
// the layer's next forward does (shardplan/nn/param_gate.h). The layout
// below is the same at every stage: a ZeRO-3 unit is one bucket, its
// members that layer's own parameters.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "shardplan/data_parallel.h"

namespace shardplan {

// Most loops want shardplan::Optimizer (shardplan/optimizer.h), which builds
// this or a plain optimizer as the plan says.
// ZeRO-1 over the batch axis of a DataParallel built from a plan with
// `data_parallel: {zero: true}`. `make` builds the real optimizer over the
// tensors it is given (views of this rank's slices, one per parameter
// each slice overlaps: of the model's parameters themselves, or with master
// weights of this rank's slice of them), e.g.
//   [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::Adam>(p, AdamOptions(1e-3)); }
// Its update must be element-wise: Adam, AdamW, SGD, RMSprop and Adagrad
// are; anything else (LBFGS) is refused before anything changes. Each rank
// keeps that optimizer's state for its slices only: 1/D of the unsharded
// state. A parameter no rank of the batch axis used since the last step gets
// no update and no state change, as with DDP and a plain optimizer whose
// zero_grad() sets gradients to none (PyTorch's default since 2.0, and what
// zero_grad() here does; libtorch 1.13's zeroes them, and Adam then moves
// a parameter with a zero gradient).
class ZeroOptimizer {
 public:
  using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;
  ZeroOptimizer(DataParallel& dp, const Factory& make);
  ~ZeroOptimizer();
  // After backward (which reduce-scattered the gradients; finish() first if
  // it has not): updates this rank's slices, then all-gathers every
  // bucket's parameters over the batch axis into the model. Collective.
  void step();
  // Clears the model's gradients and the slices'.
  void zero_grad();
  // step() in halves, for a loss scaler or clipping in between: the
  // gradients of the inner optimizer's tensors (this rank's slices, the
  // averaging completed; undefined for a parameter no rank used), then
  // step() updates with them. Collective when it completes the averaging.
  std::vector<at::Tensor> slice_grads();
  // Consumes the gradients without updating anything (a loss scaler's
  // skipped step; every rank of the batch axis must skip alike).
  void skip_step();
  // Whether the slices are master weights in another dtype than the model
  // (shardplan::Optimizer with MixedPrecision::master_dtype).
  bool masters() const;
  // Every parameter's master value, whole, in the masters' dtype (the model
  // parameter -> its value): all-gathered over the batch axis, collective.
  std::vector<std::pair<at::Tensor, at::Tensor>> gather_masters();
  torch::optim::Optimizer& inner();
  // Bytes of optimizer state this rank holds (0 before the first step for
  // optimizers whose state is created lazily).
  int64_t state_bytes() const;

  // How the inner optimizer's parameters map onto the model's, for
  // checkpoints (shardplan/checkpoint.h, CheckpointOptions::zero): per
  // bucket, this rank's slice, the whole flat bucket's length, each model
  // parameter's offset in it, and the inner optimizer's parameters: one view
  // of the slice per model parameter that overlaps it. Per parameter, so a
  // parameter no rank used in a step is left alone (no update, no state, its
  // own step count) as an optimizer over the whole parameters leaves it.
  struct Segment {
    at::Tensor tensor;   // the inner optimizer's parameter: slice[begin, begin + numel)
    size_t member = 0;   // index into Bucket::members
    int64_t begin = 0;   // in the slice
  };
  struct Bucket {
    at::Tensor slice;     // [padded / D], elements [rank * padded / D, (rank + 1) * padded / D)
    int64_t padded = 0;
    std::vector<std::pair<at::Tensor, int64_t>> members;  // (model parameter, offset), packing order
    std::vector<Segment> segments;
  };
  std::vector<Bucket> layout() const;
  DataParallel& data_parallel() const { return dp_; }

 private:
  DataParallel& dp_;
  std::unique_ptr<torch::optim::Optimizer> inner_;
  // Per bucket: this rank's slice of the master weights; undefined without
  // masters (the segments are views of the model's parameters).
  std::vector<at::Tensor> shards_;
  std::vector<std::vector<Segment>> segments_;  // per bucket
  bool prepared_ = false;  // slice_grads() ran since the last step
  void prepare();
  at::Tensor slice(size_t bucket) const;
};

}  // namespace shardplan
