#include "shardplan/dry_run.h"

#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include <mutex>

#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/world.h"
#include "shardplan/zero_optimizer.h"

namespace shardplan {

std::vector<CommStats> measure_step_comm(const Plan& plan,
                                         const std::vector<std::shared_ptr<torch::nn::Module>>& replicas,
                                         const std::function<at::Tensor(torch::nn::Module&)>& loss,
                                         std::string* data_parallel) {
  if (replicas.empty()) throw Error("measure_step_comm: no replicas");
  std::vector<CommStats> stats(replicas.size());
  std::mutex mu;
  run_ranks_in_threads(static_cast<int>(replicas.size()), [&](World& world) {
    torch::nn::Module& model = *replicas[static_cast<size_t>(world.rank())];
    const ParallelReport report = parallelize(model, plan, world);
    DataParallel dp(model, report, plan, world);
    if (dp.zero()) {
      // Attached for the step's reduce-scatter; the optimizer itself never steps.
      ZeroOptimizer zero(dp, [](std::vector<at::Tensor> p) {
        return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0));
      });
      world.reset_stats();
      loss(model).backward();
      dp.finish();
    } else {
      world.reset_stats();
      loss(model).backward();
      dp.finish();
    }
    const CommStats s = world.total_stats();
    std::lock_guard<std::mutex> lock(mu);
    if (data_parallel && world.rank() == 0 && dp.size() > 1) *data_parallel = dp.describe();
    stats[static_cast<size_t>(world.rank())] = s;
  });
  return stats;
}

}  // namespace shardplan
