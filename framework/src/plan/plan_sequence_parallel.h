#pragma once
// Internal to the plan sources: the `sequence_parallel` key of a plan and
// the rule options that refine it, kept apart from the rule parser.
#include <yaml-cpp/yaml.h>

#include <string>

#include "shardplan/plan.h"

namespace shardplan {
namespace detail {

// `value` is the key's value, `value_loc` where it starts. Throws PlanError there.
void parse_sequence_parallel(const YAML::Node& value, const SourceLoc& value_loc, Plan& plan);
// After mesh and rules are parsed: the axis exists (or can be chosen), and
// rules set `sequence_parallel` / `sequence_dim` only when the plan has the
// top-level map (it says which dim is the sequence).
void check_sequence_parallel(const Plan& plan);
// The key in canonical form, or "" when absent.
std::string sequence_parallel_yaml(const Plan& plan);
// A rule option's value checked at load time: `sequence_parallel` a bool,
// `sequence_dim` an integer. Returns "" when fine, else what was expected.
std::string sequence_option_error(const std::string& key, const std::string& value);

}  // namespace detail
}  // namespace shardplan
