// DataParallel over a TorchScript module sharded by parallelize_script: only
// where the parameters come from differs (the module's slots), so the
// buckets, hooks and averaging are data_parallel.cpp's.
#include <torch/script.h>

#include "shardplan/data_parallel.h"

namespace shardplan {

namespace {

std::vector<std::pair<std::string, at::Tensor>> named_parameters_of(const torch::jit::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : model.named_parameters()) out.emplace_back(p.name, p.value);
  return out;
}

}  // namespace

DataParallel::DataParallel(torch::jit::Module& model, const ParallelReport& report, const Plan& plan, World& world)
    : DataParallel(named_parameters_of(model), report, plan, world) {}

}  // namespace shardplan
