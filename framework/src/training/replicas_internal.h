#pragma once
// Internal: the replica check over parameters by path, shared by replicas.cpp
// and clip_grad_script.cpp.
#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace shardplan {

struct ParallelReport;
class World;

// named_parameters() order, a tied tensor under each of its paths.
void check_named_replicas(const std::vector<std::pair<std::string, at::Tensor>>& params,
                          const ParallelReport& report, World& world);

}  // namespace shardplan
