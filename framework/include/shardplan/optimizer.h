#pragma once
// One optimizer for every data-parallel loop: built over a DataParallel, it
// is a torch optimizer over the model's parameters, or ZeRO-1's sharded one
// when the plan says `data_parallel: {zero: true}`, and the loop is the same:
//   opt.zero_grad(); loss.backward(); opt.step();
// step() never steps on un-averaged gradients: it completes the averaging
// if the end of backward has not (all micro-batches under NoSync), and is
// an error inside NoSync.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "shardplan/checkpoint.h"
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
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Collective over the batch axis when it has to complete the averaging
  // (and with ZeRO, always: the all-gather of the parameters).
  void step();
  void zero_grad();

  // The torch optimizer stepping: over the parameters, or ZeRO's slices.
  torch::optim::Optimizer& inner();
  ZeroOptimizer* zero() const;  // nullptr without ZeRO-1
  DataParallel& data_parallel() const { return dp_; }
  int64_t state_bytes() const;  // optimizer state this rank holds
  // CheckpointOptions with `optimizer` or `zero` set, whichever this is.
  CheckpointOptions checkpoint_options() const;

 private:
  DataParallel& dp_;
  std::unique_ptr<torch::optim::Optimizer> plain_;
  std::unique_ptr<ZeroOptimizer> zero_;
};

}  // namespace shardplan
