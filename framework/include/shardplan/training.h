#pragma once
// What a data- and tensor-parallel training loop needs, from one call:
// parallelize() for the plan's model axes and a DataParallel for its batch
// axis. With shardplan::Optimizer the loop is PyTorch DDP's (README, "Data
// parallelism"):
//   auto t = shardplan::parallelize_for_training(*model, plan, *world);
//   shardplan::Optimizer opt(*t.data_parallel, make_adam);
//   for (auto& [x, y] : batches) {
//     opt.zero_grad();
//     loss_fn(model->forward(t.local_batch(x)), t.local_batch(y)).backward();
//     opt.step();
//   }
#include <ATen/core/Tensor.h>

#include <memory>

#include "shardplan/data_parallel.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace shardplan {

class World;

struct Training {
  ParallelReport report;                        // what parallelize() did (checkpoints need it)
  std::unique_ptr<DataParallel> data_parallel;  // size 1 when the plan has no batch axis

  // This rank's rows of a global batch (dim 0), as DataParallel::local_batch.
  at::Tensor local_batch(const at::Tensor& global) const { return data_parallel->local_batch(global); }
  // The mean over the batch axis of a per-rank value (e.g. the loss).
  double average(double local) const { return data_parallel->average(local); }
};

// parallelize(model, plan, world), then DataParallel over the result.
// Collective; throws what either throws. The model must outlive the result.
Training parallelize_for_training(torch::nn::Module& model, const Plan& plan, World& world);

}  // namespace shardplan
