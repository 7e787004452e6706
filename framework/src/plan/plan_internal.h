#pragma once
// What the plan sources share (plan.cpp: the Plan; plan_parse.cpp: YAML to
// Plan; plan_regex.cpp: rule patterns). Not installed.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "shardplan/plan.h"

namespace shardplan::plan_detail {

// A rule's pattern, compiled; PlanError at `loc` for a pattern we refuse.
std::shared_ptr<const Matcher> compile(const std::string& pattern, const SourceLoc& loc);

std::string join(const std::vector<std::string>& items, const std::string& sep);
// Where a YAML node starts in the plan, or `fallback` (its key) for a null
// node, whose mark points at whatever follows it.
SourceLoc loc_of(const YAML::Node& n, const SourceLoc& fallback);
std::optional<int> parse_positive_int(const std::string& s);
std::string mesh_spec_str(const std::vector<MeshAxisSpec>& mesh);
std::string shape_str(const std::vector<int64_t>& shape);
// Canonical YAML scalars: `quoted` always quotes, `scalar` only when needed.
std::string quoted(const std::string& s);
std::string scalar(const std::string& s);

}  // namespace shardplan::plan_detail
