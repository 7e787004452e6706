#include "plan_divide.h"

#include <set>
#include <sstream>

#include "plan_internal.h"
#include "base/utf8.h"

namespace shardplan {
namespace detail {
using plan_detail::loc_of;

namespace {

constexpr const char* kExample =
    "divide must map module path patterns to lists of integer attribute names, e.g. "
    "divide: {'blocks\\..*\\.attn': [n_head]}";

// A TorchScript attribute is a Python identifier; anything else can never be
// found, so it is refused where it is written rather than as "missing".
bool identifier(const std::string& s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

}  // namespace

void parse_divide(const YAML::Node& value, const SourceLoc& value_loc, Plan& plan) {
  plan.divide_loc = value_loc;
  if (!value.IsMap()) throw PlanError(value_loc, kExample);
  std::set<std::string> seen;
  for (auto it = value.begin(); it != value.end(); ++it) {
    const SourceLoc key_loc = loc_of(it->first, value_loc);
    if (!it->first.IsScalar()) throw PlanError(key_loc, kExample);
    DivideRule d;
    d.pattern = it->first.Scalar();
    d.loc = key_loc;
    if (!valid_utf8(d.pattern)) throw PlanError(key_loc, "divide pattern is not valid UTF-8");
    if (!seen.insert(d.pattern).second) throw PlanError(key_loc, "duplicate pattern '" + d.pattern + "' in divide");
    d.matcher = plan_detail::compile(d.pattern, key_loc);
    const YAML::Node attrs = it->second;
    const SourceLoc attrs_loc = loc_of(attrs, key_loc);
    if (!attrs.IsSequence() || attrs.size() == 0) throw PlanError(attrs_loc, kExample);
    std::set<std::string> names;
    for (const YAML::Node& a : attrs) {
      const SourceLoc aloc = loc_of(a, attrs_loc);
      if (!a.IsScalar() || !identifier(a.Scalar()))
        throw PlanError(aloc, "divide: an attribute must be a name such as n_head");
      if (!names.insert(a.Scalar()).second)
        throw PlanError(aloc, "divide: attribute '" + a.Scalar() + "' listed twice for '" + d.pattern + "'");
      d.attributes.push_back(a.Scalar());
      d.attribute_locs.push_back(aloc);
    }
    plan.divide.push_back(std::move(d));
  }
  if (plan.divide.empty()) throw PlanError(value_loc, kExample);
}

std::string divide_yaml(const Plan& plan) {
  if (plan.divide.empty()) return "";
  std::ostringstream y;
  y << "divide:\n";
  for (const DivideRule& d : plan.divide)
    y << "  " << plan_detail::quoted(d.pattern) << ": [" << plan_detail::join(d.attributes, ", ") << "]\n";
  return y.str();
}

}  // namespace detail
}  // namespace shardplan
