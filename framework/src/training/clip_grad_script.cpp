// shardplan/clip_grad.h and shardplan/replicas.h for TorchScript modules
// sharded by parallelize_script: only where the parameters come from (the
// module's slots) differs from clip_grad.cpp's and replicas.cpp's.
#include <torch/script.h>

#include "clip_grad_internal.h"
#include "replicas_internal.h"
#include "shardplan/clip_grad.h"
#include "shardplan/replicas.h"

namespace shardplan {
namespace {

std::vector<std::pair<std::string, at::Tensor>> named_of(const torch::jit::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : model.named_parameters()) out.emplace_back(p.name, p.value);
  return out;
}

}  // namespace

double grad_norm(torch::jit::Module& model, const ParallelReport& report, World& world, double norm_type,
                 bool error_if_nonfinite) {
  return named_grad_norm(named_of(model), report, world, norm_type, error_if_nonfinite);
}

double clip_grad_norm_(torch::jit::Module& model, const ParallelReport& report, World& world, double max_norm,
                       double norm_type, bool error_if_nonfinite) {
  return named_clip_grad_norm(named_of(model), report, world, max_norm, norm_type, error_if_nonfinite);
}

void check_replicas(torch::jit::Module& model, const ParallelReport& report, World& world) {
  check_named_replicas(named_of(model), report, world);
}

}  // namespace shardplan
