// Rule patterns (plan.h's Matcher), compiled once. RE2 runs them, through
// base/ecma_regex.h, which reads the ECMAScript dialect plans are written in:
// matching takes time linear in the name whatever the pattern, and neither
// compiling nor matching recurses, so no pattern within the length limit can
// hang or crash a tool that loads the plan.
#include <string>

#include "base/ecma_regex.h"
#include "plan_internal.h"

namespace shardplan {

// Per pattern, the compiled program and RE2's caches of DFA states (past
// it RE2 matches without a cache, more slowly but still linearly). Patterns
// over parameter paths take a few KiB; one that needs more than this is an
// error (about 40,000 instructions, e.g. forty '[a-z]{1000}').
constexpr int64_t kPatternMemory = 1 << 20;

class Matcher {
 public:
  explicit Matcher(const std::string& pattern) : re_(pattern, kPatternMemory) {}
  bool matches(const std::string& s) const { return re_.full_match(s); }

 private:
  regex_detail::EcmaRegex re_;
};

namespace plan_detail {

std::shared_ptr<const Matcher> compile(const std::string& pattern, const SourceLoc& loc) {
  try {
    return std::make_shared<const Matcher>(pattern);
  } catch (const regex_detail::RegexError& e) {
    throw PlanError(loc, "invalid regex " + regex_detail::shown(pattern) + ": " + e.what() +
                             " (ECMAScript syntax, matched against the whole parameter name)");
  }
}

}  // namespace plan_detail

bool DivideRule::matches(const std::string& module_path) const {
  if (!matcher) return plan_detail::compile(pattern, loc)->matches(module_path);
  return matcher->matches(module_path);
}

bool RecomputeRule::matches(const std::string& module_path) const {
  if (!matcher) return plan_detail::compile(pattern, loc)->matches(module_path);
  return matcher->matches(module_path);
}

bool PipelineStagePattern::matches(const std::string& module_path) const {
  if (!matcher) return plan_detail::compile(pattern, loc)->matches(module_path);
  return matcher->matches(module_path);
}

bool Rule::matches(const std::string& path) const {
  // Rules built in code rather than parsed have no matcher yet.
  if (!matcher) return plan_detail::compile(pattern, pattern_loc)->matches(path);
  return matcher->matches(path);
}

}  // namespace shardplan
