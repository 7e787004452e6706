// DataParallel over a TorchScript module sharded by parallelize_script: only
// where the parameters come from differs (the module's slots), so the
// buckets, hooks and averaging are data_parallel.cpp's.
#include <torch/script.h>

#include "data_parallel_impl.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"

namespace shardplan {

namespace {

std::vector<std::pair<std::string, at::Tensor>> named_parameters_of(const torch::jit::Module& model,
                                                                     const Plan& plan) {
  // ZeRO-3 gathers parameters in shardplan::nn layers' forwards; a
  // TorchScript module's forward is its own.
  if (plan.data_parallel.zero == 3)
    throw PlanError(plan.data_parallel.zero_loc,
                    "data_parallel.zero: 3 needs a C++ model of shardplan::nn layers (their forwards gather the "
                    "parameters); a TorchScript module takes zero: 1 or 2");
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : model.named_parameters()) out.emplace_back(p.name, p.value);
  return out;
}

}  // namespace

DataParallel::DataParallel(torch::jit::Module& model, const ParallelReport& report, const Plan& plan, World& world)
    : DataParallel(named_parameters_of(model, plan), report, plan, world, {}) {}

}  // namespace shardplan
