#pragma once
// Names, shapes and element sizes of the parameters in a checkpoint, for
// `shardplan plan check --state-dict`.
#include <string>
#include <vector>

#include "shardplan/plan_check.h"

namespace shardplan_plan {

struct StateDictShapes {
  std::vector<shardplan::TensorShape> params;
  std::vector<std::string> notes;  // what was skipped, and why
};

// A sharded checkpoint directory (its metadata.yaml) or a torch::save file
// of a module. Throws shardplan::Error naming the file.
StateDictShapes read_state_dict_shapes(const std::string& path);

}  // namespace shardplan_plan
