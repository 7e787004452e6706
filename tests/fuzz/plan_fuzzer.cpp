// libFuzzer target: any bytes given to the plan parser either parse or throw
// shardplan::Error (PlanError derives from it) — never crash, hang or leak.
// A parsed plan must survive its own canonical form (to_yaml -> parse) and be
// usable: matching, mesh resolution and assignment against a fixed model.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shardplan/error.h"
#include "shardplan/plan.h"

namespace {

const std::vector<shardplan::ParamInfo>& model() {
  static const std::vector<shardplan::ParamInfo> params = {
      {"fc1.weight", {64, 32}}, {"fc1.bias", {64}}, {"fc2.weight", {32, 64}},
      {"blocks.0.attn.in_proj_weight", {48, 16}}, {"embed.weight", {100, 16}},
      {"conv.weight", {8, 3, 3, 3}}};
  return params;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  shardplan::Plan plan;
  try {
    plan = shardplan::parse_plan(text, "fuzz.yaml", "/nonexistent");
  } catch (const shardplan::Error&) {
    return 0;
  }
  // The canonical form of a valid plan is valid and means the same.
  const std::string canonical = plan.to_yaml();
  shardplan::Plan again = shardplan::parse_plan(canonical, "canonical.yaml", "/nonexistent");
  if (again.to_yaml() != canonical) __builtin_trap();
  for (int world : {1, 2, 4}) {
    try {
      plan.assign(model(), world, {"loss"});
    } catch (const shardplan::Error&) {
    }
  }
  return 0;
}
