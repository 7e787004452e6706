#include "shardplan/dry_run.h"

#include <torch/nn/module.h>

#include <mutex>

#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/world.h"

namespace shardplan {

std::vector<CommStats> measure_step_comm(const Plan& plan,
                                         const std::vector<std::shared_ptr<torch::nn::Module>>& replicas,
                                         const std::function<at::Tensor(torch::nn::Module&)>& loss) {
  if (replicas.empty()) throw Error("measure_step_comm: no replicas");
  std::vector<CommStats> stats(replicas.size());
  std::mutex mu;
  run_ranks_in_threads(static_cast<int>(replicas.size()), [&](World& world) {
    torch::nn::Module& model = *replicas[static_cast<size_t>(world.rank())];
    parallelize(model, plan, world);
    world.reset_stats();
    at::Tensor l = loss(model);
    l.backward();
    const CommStats s = world.total_stats();
    std::lock_guard<std::mutex> lock(mu);
    stats[static_cast<size_t>(world.rank())] = s;
  });
  return stats;
}

}  // namespace shardplan
