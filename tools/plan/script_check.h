#pragma once
// `shardplan plan check PLAN.yaml --script FILE.pt [--probe SPEC]... --world N`:
// a TorchScript module sharded by the plan (shardplan/script.h) on N thread
// ranks and, given a probe, run against itself unsharded (verify mode).
#include <string>
#include <vector>

#include "shardplan/plan.h"
#include "shardplan/plan_check.h"

namespace shardplan_plan {

// Each SPEC is one forward argument: "2x6" a float64 normal tensor of that
// shape, "2x6:48" integers in [0, 48) (token ids), anything else a file
// written by Python's torch.save (a tensor, or a tuple or list of them).
// Errors of the plan, the rewrite or the verification are the result's;
// a file or spec that cannot be read throws shardplan::Error naming it.
shardplan::PlanCheck check_script(const std::string& file, const shardplan::Plan& plan, int world_size,
                                  const std::vector<std::string>& probes);

}  // namespace shardplan_plan
