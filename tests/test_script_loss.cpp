// The loss of a TorchScript LM with its head's vocabulary split
// (output: sharded): computed in the graph (aten::cross_entropy_loss becomes
// shardplan::vocab_cross_entropy) or by the caller
// (vocab_parallel_cross_entropy on the group ScriptParallel::group_of gives),
// each against the module unsharded in float64; and the error when the
// sharded logits reach the loss through an op the rewrite cannot follow.
#include <torch/csrc/jit/ir/ir.h>

#include "script/script_test_util.h"
#include "shardplan/nn/cross_entropy.h"

namespace test_script_loss {

using namespace shardplan;
using namespace script_test;
// parity.h has a namespace parity that a unity batch may bring in.
using script_test::parity;

namespace {

constexpr int64_t kVocab = 48;  // make_models.py's V

// kGptPlan with the LM head's vocabulary left split over the axis.
std::string sharded_head_plan() {
  std::string plan = kGptPlan;
  const std::string head = "layout: [model, null]}";
  const size_t at = plan.find(head, plan.find("head\\.weight"));
  return plan.replace(at, head.size(), "layout: [model, null], output: sharded}");
}

// (ids, targets) per step; every row's first target is class 0, which
// lm_loss_smooth.pt ignores.
Steps lm_steps(int steps) {
  torch::manual_seed(3);
  Steps out;
  for (int s = 0; s < steps; ++s) {
    auto targets = torch::randint(kVocab, {3, 6}, torch::kLong);
    targets.select(1, 0).fill_(0);
    out.push_back({torch::randint(kVocab, {3, 6}, torch::kLong), targets});
  }
  return out;
}

std::string note_of(const ParallelReport& r, const std::string& path) {
  for (const auto& row : r.rows)
    if (row.path == path) return row.note;
  return "";
}

// The op kinds of rank 0's forward graph at 2 ranks.
std::set<std::string> kinds_sharded(const std::string& file, const std::string& plan_yaml) {
  const torch::jit::Module original = load(models_dir(), file);
  const Plan plan = parse_plan(plan_yaml, "p.yaml");
  std::set<std::string> kinds;
  run_ranks_in_threads(2, [&](World& world) {
    ScriptParallel sp = parallelize_script(original, plan, world);
    if (world.rank() != 0) return;
    for (const torch::jit::Node* n : sp.module->get_method("forward").graph()->nodes())
      kinds.insert(n->kind().toQualString());
  });
  return kinds;
}

}  // namespace

class ScriptLossRanks : public ::testing::TestWithParam<int> {};

// Each model's loss, gradients and parameters after 5 SGD and 5 Adam steps.
TEST_P(ScriptLossRanks, InGraphVocabParallel) {
  REQUIRE_MODELS();
  for (const char* file : {"lm_loss.pt", "lm_loss_smooth.pt", "lm_loss_weighted.pt"})
    for (bool adam : {false, true}) {
      SCOPED_TRACE(std::string(file) + (adam ? " Adam" : " SGD"));
      const Parity p = parity(file, sharded_head_plan(), GetParam(), lm_steps(5), adam, {}, /*loss_out=*/true);
      expect_parity(p);
      EXPECT_EQ(note_of(p.reports[0], "head.weight"),
                "column-parallel (aten::linear), output sharded, cross-entropy vocab-parallel "
                "(shardplan::vocab_cross_entropy)");
    }
}

// The default gathers the logits, and the loss in the graph stays torch's.
TEST_P(ScriptLossRanks, InGraphGathered) {
  REQUIRE_MODELS();
  for (bool adam : {false, true}) expect_parity(parity("lm_loss.pt", kGptPlan, GetParam(), lm_steps(5), adam, {}, true));
}

// The caller computes the loss from the module's sharded logits.
TEST_P(ScriptLossRanks, CallerVocabParallel) {
  REQUIRE_MODELS();
  const int n = GetParam();
  const Steps steps = lm_steps(5);
  auto train_on = [&](torch::jit::Module& m, auto loss) {
    auto opt = optimizer(m, true);
    std::vector<double> losses;
    for (const auto& s : steps) {
      opt->zero_grad();
      torch::Tensor logits = m.forward({s[0]}).toTensor();
      torch::Tensor l = loss(logits.view({-1, logits.size(-1)}), s[1].view(-1));
      l.backward();
      losses.push_back(l.item<double>());
      opt->step();
    }
    return losses;
  };
  torch::jit::Module reference = load(models_dir(), "gpt.pt");
  const auto want = train_on(reference, [](const torch::Tensor& x, const torch::Tensor& t) {
    return torch::nn::functional::cross_entropy(x, t);
  });
  StateMap want_state;
  for (const auto& kv : script_state_dict(reference)) want_state[kv.first] = kv.second;
  const torch::jit::Module original = load(models_dir(), "gpt.pt");
  const Plan plan = parse_plan(sharded_head_plan(), "p.yaml");
  std::vector<std::vector<double>> got(n);
  std::vector<double> params(n);
  run_ranks_in_threads(n, [&](World& world) {
    ScriptParallel sp = parallelize_script(original, plan, world);
    Communicator& vocab = sp.group_of("head.weight");
    got[world.rank()] = train_on(*sp.module, [&](const torch::Tensor& x, const torch::Tensor& t) {
      EXPECT_EQ(x.size(1), kVocab / n);  // the module's logits are this rank's slice
      return vocab_parallel_cross_entropy(x, t, vocab);
    });
    StateMap collected;
    for (const auto& kv : collect_state_dict(script_state_dict(*sp.module), sp.report, world, -1))
      collected[kv.first] = kv.second;
    params[world.rank()] = max_diff(collected, want_state);
    EXPECT_THROW(sp.group_of("ln_f.weight"), Error);  // not split
  });
  for (int r = 0; r < n; ++r) {
    for (size_t s = 0; s < want.size(); ++s) EXPECT_NEAR(got[r][s], want[s], 1e-10) << "rank " << r << " step " << s;
    EXPECT_LT(params[r], 1e-10) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ScriptLossRanks, ::testing::Values(2, 4));

TEST(ScriptLoss, GraphHoldsTheVocabParallelLoss) {
  REQUIRE_MODELS();
  const auto sharded = kinds_sharded("lm_loss.pt", sharded_head_plan());
  EXPECT_TRUE(sharded.count("shardplan::vocab_cross_entropy"));
  EXPECT_FALSE(sharded.count("aten::cross_entropy_loss"));
  const auto gathered = kinds_sharded("lm_loss.pt", kGptPlan);
  EXPECT_FALSE(gathered.count("shardplan::vocab_cross_entropy"));
  EXPECT_TRUE(gathered.count("aten::cross_entropy_loss"));
}

TEST(ScriptLoss, ThroughAnUnknownOpRefused) {
  REQUIRE_MODELS();
  const std::string e = error_of("lm_loss_transposed.pt", sharded_head_plan());
  expect_contains(e, {"parameter 'head.weight'", "p.yaml:", "aten::cross_entropy_loss at",
                      "through aten::transpose at", "make_models.py:", "silently wrong", "output: gathered"});
  EXPECT_EQ(error_of("lm_loss_transposed.pt", kGptPlan), "");  // gathered logits are whole
}

}  // namespace test_script_loss
