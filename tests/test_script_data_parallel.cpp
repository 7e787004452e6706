// TorchScript modules on a 2-D mesh: parallelize_script over the model axis
// and DataParallel over the batch axis compose as for shardplan::nn models
// (training equals one process on the global batch), and plan keys only the
// shardplan::nn layer plugins implement are refused, not ignored.
#include "script/script_test_util.h"

#include "shardplan/data_parallel.h"

namespace test_script_data_parallel {

using namespace shardplan;
using namespace script_test;

namespace {

struct Batch {
  torch::Tensor ids, targets;
};

std::vector<Batch> lm_batches(int steps) {
  torch::manual_seed(3);
  std::vector<Batch> out;
  for (int s = 0; s < steps; ++s) out.push_back({torch::randint(48, {4, 6}), torch::randint(48, {4, 6})});
  return out;
}

torch::Tensor lm_loss(torch::jit::Module& m, const torch::Tensor& ids, const torch::Tensor& targets) {
  torch::Tensor logits = m.forward({ids}).toTensor();
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

std::string with_mesh(const std::string& plan, const std::string& mesh) {
  std::string out = plan;
  const size_t at = out.find("mesh: {model: auto}");
  out.replace(at, std::string("mesh: {model: auto}").size(), mesh);
  return out;
}

}  // namespace

class ScriptDataParallel : public ::testing::TestWithParam<bool> {};

TEST_P(ScriptDataParallel, DataTwoModelTwoEqualsOneProcessOnTheGlobalBatch) {
  REQUIRE_MODELS();
  const bool adam = GetParam();
  const auto batches = lm_batches(4);
  const Plan plan = parse_plan(with_mesh(kGptPlan, "mesh: {data: 2, model: 2}"), "gpt_2d.yaml");
  const torch::jit::Module original = load(dir, "gpt.pt");

  torch::jit::Module reference = load(dir, "gpt.pt");
  auto ref_opt = optimizer(reference, adam);
  std::vector<double> want_losses;
  for (const auto& b : batches) {
    ref_opt->zero_grad();
    torch::Tensor loss = lm_loss(reference, b.ids, b.targets);
    loss.backward();
    want_losses.push_back(loss.item<double>());
    ref_opt->step();
  }
  StateMap want;
  for (const auto& [name, t] : script_state_dict(reference)) want[name] = t.clone();

  std::mutex mu;
  double params = 0, losses = 0;
  run_ranks_in_threads(4, [&](World& world) {
    ScriptParallel sp = parallelize_script(original, plan, world);
    DataParallel dp(*sp.module, sp.report, plan, world);
    EXPECT_EQ(dp.size(), 2);
    auto opt = optimizer(*sp.module, adam);
    double worst_loss = 0;
    for (size_t s = 0; s < batches.size(); ++s) {
      opt->zero_grad();
      torch::Tensor loss = lm_loss(*sp.module, dp.local_batch(batches[s].ids), dp.local_batch(batches[s].targets));
      loss.backward();  // the end of backward averages the gradients over 'data'
      worst_loss = std::max(worst_loss, std::abs(dp.average(loss.item<double>()) - want_losses[s]));
      opt->step();
    }
    StateMap got;
    for (const auto& [name, t] : collect_state_dict(script_state_dict(*sp.module), sp.report, world, -1))
      got[name] = t;
    dp.check_replicas();
    std::lock_guard<std::mutex> lock(mu);
    params = std::max(params, max_diff(got, want));
    losses = std::max(losses, worst_loss);
  });
  EXPECT_LT(losses, 1e-10);
  EXPECT_LT(params, 1e-10) << "parameters after " << batches.size() << " steps";
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ScriptDataParallel, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Adam" : "Sgd"; });

TEST(ScriptPlanKeys, SequenceParallelIsRefusedAtItsLine) {
  REQUIRE_MODELS();
  const std::string e = error_of("gpt.pt", kGptPlan + "sequence_parallel: {dim: 1}\n");
  expect_contains(e, {"p.yaml:12:", "sequence_parallel applies to shardplan::nn models"});
}

TEST(ScriptPlanKeys, LayerPluginOptionsAreRefusedAtTheirColumn) {
  REQUIRE_MODELS();
  std::string plan = kGptPlan;
  plan.replace(plan.find("input: sharded}"), std::string("input: sharded}").size(), "input: sharded, overlap: ring}");
  expect_contains(error_of("gpt.pt", plan), {"p.yaml:8:", "'overlap' is read by the layer plugins"});
  expect_contains(error_of("gpt.pt", gpt_plan_with("divide: {'blocks\\.\\d+\\.attn': [n_head]}",
                                                   "  - {match: 'ln_f\\.weight', layout: [null], head_dim: 6}\n")),
                  {"p.yaml:", "'head_dim' is read by the layer plugins"});
}

}  // namespace test_script_data_parallel
