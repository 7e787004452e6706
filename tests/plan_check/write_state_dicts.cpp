// Writes the state dicts `shardplan plan check --state-dict` is tested on
// (tests/plan_check.cmake): OUT/gpt.pt, torch::save of the plain example GPT,
// and OUT/gpt_ckpt/, a sharded checkpoint of it under plans/gpt.yaml at 2
// ranks. Usage: plan_check_write_state_dicts PLANS_DIR OUT_DIR
#include <torch/torch.h>

#include <cstdio>
#include <mutex>
#include <string>

#include "models/model.h"
#include "shardplan/checkpoint.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace ex = shardplan::examples;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s PLANS_DIR OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string plans = argv[1], out = argv[2];
  try {
    torch::manual_seed(0);
    auto plain = ex::make_model("gpt");
    torch::save(plain.module, out + "/gpt.pt");
    const auto plan = shardplan::load_plan(plans + "/gpt.yaml");
    std::mutex mu;
    shardplan::run_ranks_in_threads(2, [&](shardplan::World& world) {
      ex::ModelHandle m;
      {
        std::lock_guard<std::mutex> lock(mu);
        torch::manual_seed(0);
        m = ex::make_model("gpt");
      }
      auto report = shardplan::parallelize(*m.module, plan, world);
      shardplan::save_checkpoint(out + "/gpt_ckpt", *m.module, report, world);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
  return 0;
}
