#pragma once
// One optimizer for every data-parallel loop: built over a DataParallel, it
// is a torch optimizer over the model's parameters, or ZeRO-1's sharded one
// when the plan says `data_parallel: {zero: true}`, and the loop is the same:
//   opt.zero_grad(); loss.backward(); opt.step();
// step() never steps on un-averaged gradients: it completes the averaging
// if the end of backward has not (all micro-batches under NoSync), and is
// an error inside NoSync. Mixed precision (float32 masters, float32
// gradient accumulation, loss scaling): shardplan/mixed_precision.h.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <memory>
#include <vector>

#include "shardplan/checkpoint.h"
#include "shardplan/mixed_precision.h"
#include "shardplan/zero_optimizer.h"

namespace torch {
namespace optim {
class Optimizer;
}
}  // namespace torch

namespace shardplan {

class DataParallel;

class Optimizer {
 public:
  // Builds the torch optimizer over the tensors it is given, e.g.
  //   [](std::vector<at::Tensor> p) {
  //     return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-3)); }
  // Without ZeRO they are the model's unique parameters (a tied tensor
  // once), so the state is per parameter as CheckpointOptions::optimizer
  // expects; with ZeRO this rank's bucket slices (ZeroOptimizer, which
  // refuses a non-element-wise update such as LBFGS).
  using Factory = ZeroOptimizer::Factory;
  Optimizer(DataParallel& dp, const Factory& make);
  // With master weights and/or a loss scaler (shardplan/mixed_precision.h).
  // With masters the factory gets them instead of the model's parameters
  // (ZeRO: slices of them), and the DataParallel accumulates gradients in
  // their dtype from now on: build it before the first backward. Throws
  // shardplan::Error, changing nothing, for a float16 parameter without a
  // loss scaler, a master dtype that is not floating point, or bad scaler
  // options.
  Optimizer(DataParallel& dp, const Factory& make, const MixedPrecision& mixed);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Collective over the batch axis when it has to complete the averaging
  // (and with ZeRO, always: the all-gather of the parameters). With a loss
  // scaler it unscales (unless unscale_() did), skips the update when any
  // rank of the world found an inf or NaN gradient (every rank alike), and
  // updates the scale: collective over the world.
  void step();
  // Clears every gradient: the model's, the masters' and the float32
  // accumulation buffers'.
  void zero_grad();

  // loss times the loss scale (the loss itself without a scaler): call
  // backward on this.
  at::Tensor scale_loss(const at::Tensor& loss) const;
  // torch's GradScaler.unscale_: completes the averaging and divides the
  // gradients step() will use by the scale, once per step, and decides
  // (over the world) whether they hold an inf or NaN. For reading or
  // clipping gradients before step(); a no-op without a scaler.
  void unscale_();
  // The tensors step() updates, in a fixed order: the model's unique
  // parameters (registration order, a tied tensor once), or their masters in
  // that order, or with ZeRO-1 its slices' segments (ZeroOptimizer::layout()
  // order: per bucket, per segment, each a piece of Bucket::members[member]).
  std::vector<at::Tensor> step_tensors();
  // Their gradients, one per tensor (undefined where none), the averaging
  // completed (collective when it completes it): what clipping scales. Valid
  // until the next backward.
  std::vector<at::Tensor> step_grads();
  bool masters() const;           // float32 (or other) master weights kept
  LossScaler* loss_scaler();      // nullptr without
  bool last_step_skipped() const; // the last step() found an inf/NaN and did not update
  // Loads what checkpoint_options() put in the attributes (the loss
  // scaler's state) from load_checkpoint's returned attributes; keys it
  // lacks change nothing. Throws naming a bad value, changing nothing.
  void load_attributes(const std::map<std::string, std::string>& attributes);

  // The torch optimizer stepping: over the parameters, or ZeRO's slices.
  torch::optim::Optimizer& inner();
  ZeroOptimizer* zero() const;  // nullptr without ZeRO-1
  DataParallel& data_parallel() const { return dp_; }
  int64_t state_bytes() const;  // optimizer state this rank holds
  // CheckpointOptions with `optimizer` or `zero` set, whichever this is,
  // the masters (saved as the parameters, float32), and the loss scaler's
  // state in the attributes.
  CheckpointOptions checkpoint_options() const;

  struct Masters;

 private:
  void init(const Factory& make, const MixedPrecision& mixed);
  void complete_grads();
  DataParallel& dp_;
  std::unique_ptr<torch::optim::Optimizer> plain_;
  std::unique_ptr<ZeroOptimizer> zero_;
  std::unique_ptr<Masters> masters_;  // plain optimizer over master copies
  std::unique_ptr<LossScaler> scaler_;
  bool unscaled_ = false, found_inf_ = false, skipped_ = false;
};

}  // namespace shardplan
