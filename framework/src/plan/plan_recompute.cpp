#include "plan_recompute.h"

#include <set>
#include <sstream>

#include "plan_internal.h"
#include "base/utf8.h"

namespace shardplan {
namespace detail {
using plan_detail::loc_of;

namespace {

constexpr const char* kRecomputeExample =
    "recompute must be a list of module path patterns, each a regex (full mode) or {module: <regex>, mode: "
    "full|selective}, e.g. recompute: ['blocks\\.\\d+'] or recompute: [{module: 'layers\\.\\d+\\.self_attn', "
    "mode: selective}]";

RecomputeRule entry(const YAML::Node& item, const SourceLoc& iloc) {
  RecomputeRule r;
  r.loc = r.mode_loc = iloc;
  // yaml-cpp's Node assignment writes into the node referred to: the
  // pattern's node is picked by index, never reassigned.
  std::vector<YAML::Node> found;
  SourceLoc ploc = iloc;
  if (!item.IsMap()) found.push_back(item);
  if (item.IsMap()) {
    std::set<std::string> seen;
    for (auto it = item.begin(); it != item.end(); ++it) {
      const SourceLoc key_loc = loc_of(it->first, iloc);
      const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
      const YAML::Node v = it->second;
      const SourceLoc vloc = loc_of(v, key_loc);
      if (!seen.insert(key).second) throw PlanError(key_loc, "duplicate key '" + key + "' in a recompute entry");
      if (key == "module") {
        found.push_back(v);
        ploc = vloc;
      } else if (key == "mode") {
        if (!v.IsScalar() || (v.Scalar() != "full" && v.Scalar() != "selective"))
          throw PlanError(vloc, "recompute mode must be full (the module's whole forward) or selective "
                                "(attention's core: scores, softmax, dropout, weights times values)");
        r.mode = v.Scalar();
        r.mode_loc = vloc;
      } else {
        throw PlanError(key_loc, "unknown key '" + (valid_utf8(key) ? key : std::string("<not UTF-8>")) +
                                     "' in a recompute entry (expected module, mode)");
      }
    }
    if (found.empty() || found[0].IsNull())
      throw PlanError(iloc, "a recompute entry needs module: <regex over module paths>");
  }
  const YAML::Node& pattern = found[0];
  if (!pattern.IsScalar() || pattern.Scalar().empty()) throw PlanError(ploc, kRecomputeExample);
  if (!valid_utf8(pattern.Scalar())) throw PlanError(ploc, "recompute pattern is not valid UTF-8");
  r.pattern = pattern.Scalar();
  r.loc = ploc;
  if (!item.IsMap()) r.mode_loc = ploc;
  // The rules' checks (length, nesting, syntax): a refused regex fails here, at its line.
  r.matcher = plan_detail::compile(r.pattern, ploc);
  return r;
}

}  // namespace

void parse_recompute(const YAML::Node& value, const SourceLoc& value_loc, Plan& plan) {
  plan.recompute_loc = value_loc;
  if (!value.IsSequence() || value.size() == 0) throw PlanError(value_loc, kRecomputeExample);
  std::set<std::string> seen;
  for (const YAML::Node& item : value) {
    const SourceLoc iloc = loc_of(item, value_loc);
    if (plan.recompute.size() == kMaxPlanRules)
      throw PlanError(iloc, "more than " + std::to_string(kMaxPlanRules) + " recompute entries");
    RecomputeRule r = entry(item, iloc);
    if (!seen.insert(r.pattern).second)
      throw PlanError(r.loc, "duplicate pattern '" + r.pattern + "' in recompute");
    plan.recompute.push_back(std::move(r));
  }
}

std::string recompute_yaml(const Plan& plan) {
  if (plan.recompute.empty()) return "";
  std::ostringstream y;
  y << "recompute:\n";
  for (const RecomputeRule& r : plan.recompute) {
    // Quoted as rule patterns are (a control character goes double-quoted).
    if (r.mode == "full")
      y << "  - " << plan_detail::quoted(r.pattern) << "\n";
    else
      y << "  - {module: " << plan_detail::quoted(r.pattern) << ", mode: " << r.mode << "}\n";
  }
  return y.str();
}

}  // namespace detail
}  // namespace shardplan
