#pragma once
// Internal to the plan sources: the top-level `divide` key (attributes of
// TorchScript modules divided by the model axis), apart from the rule parser.
#include <yaml-cpp/yaml.h>

#include <string>

#include "shardplan/plan.h"

namespace shardplan {
namespace detail {

// `value` is the key's value, `value_loc` where it starts. Throws PlanError there.
void parse_divide(const YAML::Node& value, const SourceLoc& value_loc, Plan& plan);
// The key in canonical form, or "" when absent.
std::string divide_yaml(const Plan& plan);

}  // namespace detail
}  // namespace shardplan
