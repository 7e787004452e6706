// Sharded checkpoints of TorchScript modules (save_checkpoint /
// load_checkpoint overloads for torch::jit::Module): training stopped at one
// world size and resumed at another, optimizer state included, equals
// training unsharded without a stop; the whole tensors read back are the
// unsharded module's.
#include "script/script_test_util.h"

namespace test_script_checkpoint {

using namespace shardplan;
using namespace script_test;

namespace {

// Steps [from, to) of `inputs` on `m` with `opt`, the loss script_test::train uses.
void run_steps(torch::jit::Module& m, torch::optim::Optimizer& opt, const std::vector<torch::Tensor>& inputs,
               size_t from, size_t to) {
  for (size_t s = from; s < to; ++s) {
    opt.zero_grad();
    loss_of(m.forward({inputs[s]}).toTensor()).backward();
    opt.step();
  }
}

// A copy: script_state_dict's tensors share the parameters' storage, which later steps change.
StateMap state_of(const StateDict& dict) {
  StateMap out;
  for (const auto& [name, t] : dict) out[name] = t.clone();
  return out;
}

std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(SHARDPLAN_BINARY_DIR) / "tests" / ("script_ckpt_" + name + std::to_string(getpid()));
  fs::remove_all(dir);
  return dir.string();
}

}  // namespace

TEST(ScriptCheckpoint, SavedAtTwoRanksResumedAtFourEqualsUnshardedWithAdam) {
  REQUIRE_MODELS();
  const auto inputs = id_inputs(48, 4);
  const Plan plan = parse_plan(kGptPlan, "gpt_head_parallel.yaml");
  const torch::jit::Module original = load(dir, "gpt.pt");

  torch::jit::Module reference = load(dir, "gpt.pt");
  auto ref_opt = optimizer(reference, /*adam=*/true);
  run_steps(reference, *ref_opt, inputs, 0, 2);
  const StateMap at_save = state_of(script_state_dict(reference));
  run_steps(reference, *ref_opt, inputs, 2, 4);
  const StateMap at_end = state_of(script_state_dict(reference));

  const std::string ckpt = fresh_dir("resume");
  run_ranks_in_threads(2, [&](World& world) {
    ScriptParallel sp = parallelize_script(original, plan, world);
    auto opt = optimizer(*sp.module, true);
    run_steps(*sp.module, *opt, inputs, 0, 2);
    CheckpointOptions o;
    o.optimizer = opt.get();
    o.attributes["step"] = "2";
    save_checkpoint(ckpt, *sp.module, sp.report, world, o);
  });

  // The whole tensors, read offline, are the unsharded module's after 2 steps.
  EXPECT_LT(max_diff(state_of(read_checkpoint(ckpt)), at_save), 1e-10);

  std::mutex mu;
  double worst = 0;
  run_ranks_in_threads(4, [&](World& world) {
    ScriptParallel sp = parallelize_script(original, plan, world);
    auto opt = optimizer(*sp.module, true);
    CheckpointOptions o;
    o.optimizer = opt.get();
    const auto attributes = load_checkpoint(ckpt, *sp.module, sp.report, world, o);
    EXPECT_EQ(attributes.at("step"), "2");
    run_steps(*sp.module, *opt, inputs, 2, 4);
    const StateMap got = state_of(collect_state_dict(script_state_dict(*sp.module), sp.report, world, -1));
    std::lock_guard<std::mutex> lock(mu);
    worst = std::max(worst, max_diff(got, at_end));
  });
  EXPECT_LT(worst, 1e-10) << "resumed at 4 ranks against 4 steps unsharded";
  fs::remove_all(ckpt);
}

TEST(ScriptCheckpoint, ShardedCheckpointLoadsIntoTheUnshardedModule) {
  REQUIRE_MODELS();
  const auto inputs = id_inputs(48, 2);
  const Plan plan = parse_plan(kGptPlan, "gpt_head_parallel.yaml");
  const torch::jit::Module original = load(dir, "gpt.pt");
  torch::jit::Module reference = load(dir, "gpt.pt");
  auto ref_opt = optimizer(reference, false);
  run_steps(reference, *ref_opt, inputs, 0, 2);

  const std::string ckpt = fresh_dir("unsharded");
  run_ranks_in_threads(4, [&](World& world) {
    ScriptParallel sp = parallelize_script(original, plan, world);
    auto opt = optimizer(*sp.module, false);
    run_steps(*sp.module, *opt, inputs, 0, 2);
    save_checkpoint(ckpt, *sp.module, sp.report, world);
  });
  torch::jit::Module whole = load(dir, "gpt.pt");
  run_ranks_in_threads(1, [&](World& world) { load_checkpoint(ckpt, whole, ParallelReport{}, world); });
  EXPECT_LT(max_diff(state_of(script_state_dict(whole)), state_of(script_state_dict(reference))), 1e-10);
  fs::remove_all(ckpt);
}

TEST(ScriptCheckpoint, CheckpointOfAnotherModelIsRefusedNamingTheTensor) {
  REQUIRE_MODELS();
  const std::string ckpt = fresh_dir("other");
  torch::jit::Module mlp = load(dir, "mlp.pt");
  run_ranks_in_threads(1, [&](World& world) { save_checkpoint(ckpt, mlp, ParallelReport{}, world); });
  torch::jit::Module gpt = load(dir, "gpt.pt");
  const StateMap before = state_of(script_state_dict(gpt));
  std::string error;
  try {
    run_ranks_in_threads(1, [&](World& world) { load_checkpoint(ckpt, gpt, ParallelReport{}, world); });
  } catch (const std::exception& e) {
    error = e.what();
  }
  expect_contains(error, {"the checkpoint has no tensor '", "a different model?"});
  EXPECT_EQ(max_diff(state_of(script_state_dict(gpt)), before), 0) << "a failed load changed the module";
  fs::remove_all(ckpt);
}

}  // namespace test_script_checkpoint
