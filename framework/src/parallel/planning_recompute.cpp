// The plan's `recompute:` list matched against module paths: each module it
// names must derive from shardplan::Recomputable and implement the mode.
#include <string>
#include <vector>

#include "shardplan/error.h"
#include "shardplan/recompute.h"
#include "planning.h"

namespace shardplan::parallel_detail {

namespace {

RecomputeMode mode_of(const RecomputeRule& r) {
  return r.mode == "selective" ? RecomputeMode::selective : RecomputeMode::full;
}

// "" when `m` can recompute in the rule's mode, else why not.
std::string refusal(torch::nn::Module& m, const RecomputeRule& r, const std::string& path, const std::string& type) {
  const auto* rc = dynamic_cast<const Recomputable*>(&m);
  const std::string what = "recompute: module '" + path + "' matched by '" + r.pattern + "' is a " + type;
  if (!rc)
    return what + ", which cannot recompute its forward: match only modules that derive from shardplan::Recomputable "
                  "(the example GPT's blocks.N, Llama's model.layers.N, or for mode: selective "
                  "shardplan::nn::MultiheadAttention and Llama's self_attn), or derive its type from it "
                  "(shardplan/recompute.h)";
  if (!rc->can_recompute(mode_of(r)))
    return what + ", which does not implement mode " + r.mode + " (" +
           (rc->can_recompute(RecomputeMode::full) ? "it recomputes its whole forward: mode: full"
                                                    : "selective recomputes attention's core only") +
           ")";
  return "";
}

void fail(Planning& st, const PlanError& err) {
  if (!st.errors) throw err;
  st.errors->push_back(err.what());
}

}  // namespace

void plan_recompute(Planning& st, torch::nn::Module& model) {
  const auto& rules = st.plan.recompute;
  if (rules.empty()) return;
  std::vector<bool> hit(rules.size(), false);
  model.apply([&](const std::string& path, torch::nn::Module& m) {
    if (path.empty()) return;  // the root: patterns name parts of a model
    for (size_t i = 0; i < rules.size(); ++i) {
      if (!rules[i].matches(path)) continue;
      hit[i] = true;
      const std::string type = st.type_names.of(m);
      const std::string why = refusal(m, rules[i], path, type);
      if (!why.empty()) {
        fail(st, PlanError(rules[i].loc, why));
        return;
      }
      st.out.recompute.push_back({dynamic_cast<Recomputable*>(&m), mode_of(rules[i])});
      st.out.recompute_rows.push_back({path, type, rules[i].mode, rules[i].loc.str()});
      return;  // the first pattern that matches a module wins, as rules do
    }
  });
  for (size_t i = 0; i < rules.size(); ++i) {
    if (hit[i]) continue;
    const PlanError err(rules[i].loc, "recompute pattern '" + rules[i].pattern + "' matched no module");
    if (st.plan.strict)
      fail(st, err);
    else
      st.out.warnings.push_back(err.what());
  }
}

}  // namespace shardplan::parallel_detail
