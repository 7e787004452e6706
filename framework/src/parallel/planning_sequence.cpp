// Sequence parallelism of one module: the plan's `sequence_parallel` map as
// the module's rules refine it.
#include <string>
#include <vector>

#include "shardplan/error.h"
#include "planning.h"

namespace shardplan::parallel_detail {

SequenceShard sequence_of(const Plan& plan, const std::string& axis, const std::vector<const Rule*>& rules,
                          const std::string& module) {
  SequenceShard seq;
  if (!plan.sequence_parallel.enabled) return seq;
  seq.on = true;
  seq.axis = axis;
  seq.dim = plan.sequence_parallel.dim;
  // Each rule's answer (its option, else the plan's), and where it came from.
  const Rule* on_from = nullptr;
  const Rule* dim_from = nullptr;
  auto where = [](const Rule* r, const char* key) {
    const RuleOption* o = r->option(key);
    return o ? o->loc.str() : "the rule at " + r->loc.str() + " (the plan's setting)";
  };
  for (const Rule* r : rules) {
    if (!r) continue;
    const RuleOption* on = r->option("sequence_parallel");
    const bool rule_on = on ? on->value == "true" : true;
    if (on_from && rule_on != seq.on) {
      const SourceLoc& at = on ? on->loc : r->loc;
      throw PlanError(at, "module '" + module + "': sequence_parallel is " + (rule_on ? "true" : "false") +
                              " here but " + (seq.on ? "true" : "false") + " at " +
                              where(on_from, "sequence_parallel") + " (the rules of one layer must agree)");
    }
    if (!on_from) seq.on = rule_on;
    on_from = r;
    const RuleOption* d = r->option("sequence_dim");
    const int64_t rule_dim = d ? std::stoll(d->value) : plan.sequence_parallel.dim;
    if (dim_from && rule_dim != seq.dim)
      throw PlanError(d ? d->loc : r->loc, "module '" + module + "': sequence_dim is " + std::to_string(rule_dim) +
                                               " here but " + std::to_string(seq.dim) + " at " +
                                               where(dim_from, "sequence_dim") + " (the rules of one layer must agree)");
    seq.dim = rule_dim;
    dim_from = r;
  }
  if (!seq.on) seq = SequenceShard{};
  return seq;
}

}  // namespace shardplan::parallel_detail
