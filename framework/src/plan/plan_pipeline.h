#pragma once
// Internal to the plan sources: the top-level `pipeline` key (the axis that
// cuts the model into stages, the schedule, the micro-batches, the stages).
#include <yaml-cpp/yaml.h>

#include <string>

#include "shardplan/plan.h"

namespace shardplan {
namespace detail {

// `value` is the key's value, `value_loc` where it starts. Throws PlanError there.
void parse_pipeline(const YAML::Node& value, const SourceLoc& value_loc, Plan& plan);
// After the mesh and rules: the axis is a mesh axis that neither a rule nor
// the batch axis uses, and the stages fit its size. Throws PlanError.
void check_pipeline(const Plan& plan);
// The key in canonical form, or "" when absent.
std::string pipeline_yaml(const Plan& plan);

}  // namespace detail
}  // namespace shardplan
