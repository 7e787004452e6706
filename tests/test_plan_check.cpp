// The plan checker's C++ API (shardplan/plan_check.h, shardplan/dry_run.h):
// every error of a plan at once (a tie planned two ways, a size the axis does
// not divide, a rule matching nothing), the JSON report, the checker over
// names and shapes alone, and the bytes a dry run of one training step
// communicates. The `shardplan plan check` tool is tested by
// tests/plan_check.cmake.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "shardplan/dry_run.h"
#include "shardplan/nn/embedding.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/plan_check.h"
#include "shardplan/tied.h"

namespace test_plan_check {

namespace {

// An embedding tied to a head, and a Linear of 6 outputs.
struct TiedNetImpl : torch::nn::Module {
  TiedNetImpl() {
    emb = register_module("emb", shardplan::nn::Embedding(16, 8));
    head = register_module("head", shardplan::nn::Linear(torch::nn::LinearOptions(8, 16).bias(false)));
    head->weight = shardplan::tie_parameter(*head, "weight", emb->weight);
    fc = register_module("fc", shardplan::nn::Linear(8, 6));
  }
  shardplan::nn::Embedding emb{nullptr};
  shardplan::nn::Linear head{nullptr}, fc{nullptr};
};
TORCH_MODULE(TiedNet);

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", shardplan::nn::Linear(4, 8));
    fc2 = register_module("fc2", shardplan::nn::Linear(8, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

const char* kMlpPlan =
    "mesh: {model: auto}\n"
    "rules:\n"
    "  - {match: 'fc1\\.weight', layout: [model, null], output: sharded}\n"
    "  - {match: 'fc1\\.bias', layout: [model]}\n"
    "  - {match: 'fc2\\.weight', layout: [null, model], input: sharded}\n";

bool has(const std::vector<std::string>& lines, const std::string& text) {
  for (const auto& l : lines)
    if (l.find(text) != std::string::npos) return true;
  return false;
}

TEST(PlanCheck, ListsEveryErrorNotTheFirst) {
  TiedNet net;
  const auto plan = shardplan::parse_plan(
      "mesh: {model: auto}\n"
      "rules:\n"
      "  - {match: 'emb\\.weight', layout: [model, null]}\n"
      "  - {match: 'fc\\.weight', layout: [model, null]}\n"
      "  - {match: 'nothing', layout: []}\n",
      "t.yaml");
  const auto check = shardplan::check_plan_for_model(*net, plan, 4);
  EXPECT_FALSE(check.ok());
  ASSERT_EQ(check.errors.size(), 3u) << ::testing::PrintToString(check.errors);
  EXPECT_TRUE(has(check.errors, "t.yaml:5:5: rule 3 (match: 'nothing') matched no parameter"));
  EXPECT_TRUE(has(check.errors, "t.yaml:4:35: parameter 'fc.weight': out_features 6 is not divisible"));
  EXPECT_TRUE(has(check.errors, "t.yaml:3:5: tied parameters 'emb.weight' (layout [model, null]"));
  EXPECT_TRUE(check.rank_bytes.empty());
  EXPECT_NE(check.table().find("result: the plan cannot run (3 errors)"), std::string::npos) << check.table();
  EXPECT_NE(check.json().find("\"ok\": false"), std::string::npos);
  // Without the error list, the first one throws as before.
  EXPECT_THROW(shardplan::check_plan(*net, plan, 4), shardplan::PlanError);
}

TEST(PlanCheck, ReportsBytesPerRankAndJson) {
  Mlp mlp;
  const auto plan = shardplan::parse_plan(kMlpPlan, "mlp.yaml");
  const auto check = shardplan::check_plan_for_model(*mlp, plan, 2);
  ASSERT_TRUE(check.ok()) << check.table();
  // fc1 (32 + 8) and fc2.weight (40) halved, fc2.bias (5) whole; floats.
  EXPECT_EQ(check.rank_bytes, (std::vector<int64_t>{(20 + 20 + 5) * 4, (20 + 20 + 5) * 4}));
  EXPECT_EQ(check.report.global_bytes(), (32 + 8 + 40 + 5) * 4);
  const std::string json = check.report.json();
  EXPECT_NE(json.find("{\"path\": \"fc1.weight\", \"module_type\": \"shardplan::nn::LinearImpl\", \"rule\": "
                      "\"mlp.yaml:3:5\", \"layout\": \"[model, null]\", \"plugin\": \"dense\""),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"global_shape\": [8, 4], \"local_shape\": [4, 4], \"element_size\": 4"), std::string::npos);
  EXPECT_NE(json.find("\"mesh\": {\"model\": 2}"), std::string::npos);
  EXPECT_NE(check.json().find("\"rank_bytes\": [180, 180]"), std::string::npos) << check.json();
}

TEST(PlanCheck, FromShapesAloneSplitsBlocksAndWarnsOnUnevenDims) {
  const auto plan = shardplan::parse_plan(
      "mesh: {model: auto}\n"
      "rules:\n"
      "  - {match: 'qkv\\.weight', layout: [model, null], blocks: 3}\n"
      "  - {match: 'loss', layout: [null, model]}\n",
      "s.yaml");
  const auto check = shardplan::check_plan_for_shapes({{"qkv.weight", {9, 4}, 8}, {"b", {3}, 4}}, plan, 2);
  ASSERT_TRUE(check.ok()) << check.table();
  EXPECT_FALSE(check.plugins_consulted);
  // 3 blocks of 3 rows: rank 0 takes 2 rows of each, rank 1 one.
  EXPECT_EQ(check.report.rows[0].local_shape, (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(check.rank_bytes, (std::vector<int64_t>{6 * 4 * 8 + 12, 3 * 4 * 8 + 12}));
  EXPECT_TRUE(has(check.report.warnings, "does not divide evenly among the 2 ranks of axis 'model'"));
  EXPECT_TRUE(has(check.report.warnings, "s.yaml:4:5: rule 2 (match: 'loss') matched no parameter"));

  const auto bad = shardplan::check_plan_for_shapes({{"qkv.weight", {8, 4}, 4}}, plan, 2);
  ASSERT_EQ(bad.errors.size(), 1u);
  EXPECT_EQ(bad.errors[0], "s.yaml:3:59: parameter 'qkv.weight': dim 0 (size 8) is not 3 equal blocks");
  const auto rank = shardplan::check_plan_for_shapes({{"qkv.weight", {12}, 4}}, plan, 2);
  ASSERT_EQ(rank.errors.size(), 1u);
  EXPECT_NE(rank.errors[0].find("s.yaml:3:36: layout [model, null] has 2 dims but parameter 'qkv.weight' has 1 dim"),
            std::string::npos)
      << rank.errors[0];
}

TEST(PlanCheck, DryRunCountsOneStepsCollectives) {
  const auto plan = shardplan::parse_plan(kMlpPlan, "mlp.yaml");
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(1);
    replicas.push_back(Mlp().ptr());
  }
  const auto x = torch::randn({3, 4}).requires_grad_();
  const auto stats = shardplan::measure_step_comm(plan, replicas, [&](torch::nn::Module& m) {
    return dynamic_cast<MlpImpl&>(m).forward(x).sum();
  });
  ASSERT_EQ(stats.size(), 2u);
  for (const auto& s : stats) {
    // Forward: fc2's all-reduce of [3, 5]; backward: fc1's input gradient [3, 4].
    EXPECT_EQ(s.bytes, (3u * 5 + 3u * 4) * 4);
    EXPECT_EQ(s.calls, 2u);
  }
}

}  // namespace

}  // namespace test_plan_check
