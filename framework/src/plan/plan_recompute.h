#pragma once
// Internal to the plan sources: the top-level `recompute` key (modules whose
// forward is recomputed in backward), apart from the rule parser.
#include <yaml-cpp/yaml.h>

#include <string>

#include "shardplan/plan.h"

namespace shardplan {
namespace detail {

// `value` is the key's value, `value_loc` where it starts. Throws PlanError there.
void parse_recompute(const YAML::Node& value, const SourceLoc& value_loc, Plan& plan);
// The key in canonical form, or "" when absent.
std::string recompute_yaml(const Plan& plan);

}  // namespace detail
}  // namespace shardplan
