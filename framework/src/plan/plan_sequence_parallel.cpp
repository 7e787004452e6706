#include "plan_sequence_parallel.h"

#include <set>
#include <sstream>

#include "plan_internal.h"
#include "base/utf8.h"

namespace shardplan {
namespace detail {
using plan_detail::loc_of;

namespace {

// Sequence dims are small: an activation has a handful of dims.
bool parse_dim(const std::string& s, int64_t& out) {
  if (s.empty() || s.size() > 3) return false;
  size_t i = s[0] == '-' ? 1 : 0;
  if (i == s.size()) return false;
  for (size_t k = i; k < s.size(); ++k)
    if (s[k] < '0' || s[k] > '9') return false;
  out = std::stoll(s);
  return true;
}

}  // namespace

void parse_sequence_parallel(const YAML::Node& value, const SourceLoc& value_loc, Plan& plan) {
  SequenceParallelSpec& sp = plan.sequence_parallel;
  sp.loc = value_loc;
  static const char* kExample =
      "sequence_parallel must be a map with the sequence dim of the activations, e.g. sequence_parallel: {dim: 0} "
      "for [seq, batch, features] or {dim: 1} for [batch, seq, features]";
  if (!value.IsMap()) throw PlanError(value_loc, kExample);
  std::set<std::string> seen;
  bool has_dim = false;
  for (auto it = value.begin(); it != value.end(); ++it) {
    const SourceLoc key_loc = loc_of(it->first, value_loc);
    const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
    const YAML::Node v = it->second;
    const SourceLoc vloc = loc_of(v, key_loc);
    if (!seen.insert(key).second) throw PlanError(key_loc, "duplicate key '" + key + "' in sequence_parallel");
    if (key == "dim") {
      if (!v.IsScalar() || !parse_dim(v.Scalar(), sp.dim))
        throw PlanError(vloc, "sequence_parallel.dim must be an integer (the sequence dim of the activations; "
                              "negative counts from the end)");
      has_dim = true;
    } else if (key == "axis") {
      if (!v.IsScalar() || v.Scalar().empty())
        throw PlanError(vloc, "sequence_parallel.axis must be the name of a mesh axis");
      if (!valid_utf8(v.Scalar())) throw PlanError(vloc, "sequence_parallel.axis is not valid UTF-8");
      sp.axis = v.Scalar();
      sp.axis_loc = vloc;
    } else {
      throw PlanError(key_loc, "unknown key '" + key + "' in sequence_parallel (expected dim, axis)");
    }
  }
  // Which dim is the sequence is never guessed: [T, B, E] and [B, T, E] are
  // both common, and a wrong guess splits the batch instead, silently.
  if (!has_dim) throw PlanError(value_loc, kExample);
  sp.enabled = true;
}

void check_sequence_parallel(const Plan& plan) {
  const SequenceParallelSpec& sp = plan.sequence_parallel;
  if (!sp.enabled) {
    for (const Rule& r : plan.rules)
      for (const char* key : {"sequence_parallel", "sequence_dim"})
        if (const RuleOption* o = r.option(key))
          throw PlanError(o->loc, std::string("option '") + key +
                                      "' needs the plan's top-level sequence_parallel map, which says which dim of "
                                      "the activations is the sequence (e.g. sequence_parallel: {dim: 0})");
    return;
  }
  plan.sequence_axis();  // throws when it cannot be chosen
}

std::string sequence_parallel_yaml(const Plan& plan) {
  const SequenceParallelSpec& sp = plan.sequence_parallel;
  if (!sp.enabled) return "";
  std::ostringstream y;
  y << "sequence_parallel: {dim: " << sp.dim;
  if (!sp.axis.empty()) y << ", axis: " << plan_detail::scalar(sp.axis);
  y << "}\n";
  return y.str();
}

std::string sequence_option_error(const std::string& key, const std::string& value) {
  if (key == "sequence_parallel")
    return value == "true" || value == "false" ? "" : "true or false";
  if (key == "sequence_dim") {
    int64_t d = 0;
    return parse_dim(value, d) ? "" : "an integer (negative counts from the end)";
  }
  return "";
}

}  // namespace detail

std::string Plan::sequence_axis() const {
  const SequenceParallelSpec& sp = sequence_parallel;
  if (!sp.enabled) return "";
  std::string names;
  for (const auto& a : mesh) names += (names.empty() ? "" : ", ") + a.name;
  if (!sp.axis.empty()) {
    for (const auto& a : mesh)
      if (a.name == sp.axis) return sp.axis;
    throw PlanError(sp.axis_loc, "sequence_parallel.axis '" + sp.axis + "' is not a mesh axis; mesh axes are: " + names);
  }
  const std::string batch = batch_axis();
  std::string found;
  for (const auto& a : mesh) {
    // The pipe axis cuts between modules; it never holds a tensor-parallel group.
    if (a.name == batch || (pipeline.enabled && a.name == pipeline.axis)) continue;
    if (!found.empty())
      throw PlanError(sp.loc, "sequence_parallel: the mesh has several axes besides the batch axis (" + names +
                                  "); name the one tensor parallelism uses, e.g. {dim: 0, axis: model}");
    found = a.name;
  }
  if (found.empty())
    throw PlanError(sp.loc, "sequence_parallel: the mesh has no axis besides the batch axis '" + batch +
                                "' to split the sequence over");
  return found;
}

}  // namespace shardplan
