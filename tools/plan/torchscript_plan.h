#pragma once
// `shardplan plan auto --torchscript FILE` and `--state-dict FILE`: plans for
// models this program cannot build, from what their files say (the forward
// graph of a TorchScript module; the names and shapes of a checkpoint).
#include <string>
#include <vector>

#include "shardplan/auto_plan.h"
#include "shardplan/plan.h"
#include "shardplan/plan_check.h"
#include "state_dict.h"

namespace shardplan_plan {

struct FilePlan {
  shardplan::Plan plan;
  std::vector<shardplan::TensorShape> params;  // what `plan check` checks it against
};

// Loads FILE with torch::jit::load, inlines its forward graph and pairs the
// linear and convolution ops it finds there the Megatron way. Throws
// shardplan::Error, one line naming the file, when it is not a TorchScript
// module with a forward method.
FilePlan plan_torchscript(const std::string& file, int world_size, const shardplan::AutoPlanOptions& options);

// From names and shapes alone: consecutive [h, d] then [d, h] weights of one
// module (an MLP) become a pair, every rule saying it was inferred.
shardplan::Plan plan_state_dict(const StateDictShapes& shapes, const std::string& file, int world_size,
                                const shardplan::AutoPlanOptions& options);

}  // namespace shardplan_plan
