#pragma once
// Internal to plan.cpp: the data-parallel keys of a plan (`batch_axis`,
// `data_parallel`), kept apart from the rule parser.
#include <yaml-cpp/yaml.h>

#include <string>

#include "shardplan/plan.h"

namespace shardplan {
namespace detail {

// `value` is the key's value, `value_loc` where it starts (the key's own
// location when the value is null). Throw PlanError there.
void parse_batch_axis(const YAML::Node& value, const SourceLoc& value_loc, Plan& plan);
void parse_data_parallel(const YAML::Node& value, const SourceLoc& value_loc, Plan& plan);
// After the mesh is parsed: an explicit batch axis must be one of its axes.
void check_batch_axis(const Plan& plan);
// The keys in canonical form, or "" when every value is the default.
std::string data_parallel_yaml(const Plan& plan);

}  // namespace detail
}  // namespace shardplan
