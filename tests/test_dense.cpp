// The dense plugin against the same model run unsharded in one process:
// forward output, input and parameter gradients, and parameters after five
// optimizer steps, at world sizes 1, 2 and 4, in float64 and float32.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <mutex>

#include "shardplan/error.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"
#include "parity.h"

namespace test_dense {

namespace {

using shardplan::nn::Linear;

struct MLPImpl : torch::nn::Cloneable<MLPImpl> {
  MLPImpl(int64_t in, int64_t hidden, int64_t out, bool bias) : in(in), hidden(hidden), out(out), bias(bias) {
    reset();
  }
  void reset() override {
    fc1 = register_module("fc1", Linear(torch::nn::LinearOptions(in, hidden).bias(bias)));
    fc2 = register_module("fc2", Linear(torch::nn::LinearOptions(hidden, out).bias(bias)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::tanh(fc1->forward(x))); }
  int64_t in, hidden, out;
  bool bias;
  Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(MLP);

// Which dim of each parameter a config splits (-1: replicated).
using Splits = std::map<std::string, int64_t>;

struct Config {
  std::string name;
  std::string rules;
  Splits splits;
};

std::vector<Config> configs() {
  return {
      {"column_gathered", "  - {match: 'fc1\\.weight', layout: [model, null]}\n", {{"fc1.weight", 0}, {"fc1.bias", 0}}},
      {"row_split_on_entry", "  - {match: 'fc1\\.weight', layout: [null, model]}\n", {{"fc1.weight", 1}}},
      {"column_then_row",
       "  - {match: 'fc1\\.weight', layout: [model, null], output: sharded}\n"
       "  - {match: 'fc1\\.bias', layout: [model]}\n"
       "  - {match: 'fc2\\.weight', layout: [null, model], input: sharded}\n",
       {{"fc1.weight", 0}, {"fc1.bias", 0}, {"fc2.weight", 1}}},
      {"last_layer_column_gathered", "  - {match: 'fc2\\.weight', layout: [model, null], output: gathered}\n",
       {{"fc2.weight", 0}, {"fc2.bias", 0}}},
  };
}

// Without biases a bias rule matches nothing, which only strict plans reject.
shardplan::Plan plan_for(const Config& c, bool strict = true) {
  return shardplan::parse_plan(std::string(strict ? "" : "strict: false\n") + "mesh: {model: auto}\nrules:\n" + c.rules,
                               c.name + ".yaml");
}

struct Case {
  int world;
  torch::Dtype dtype;
  bool bias;
  bool adam;
  Config config;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.config.name << " world " << c.world; }

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return c.config.name + "_ws" + std::to_string(c.world) + (c.dtype == torch::kDouble ? "_f64" : "_f32") +
         (c.bias ? "_bias" : "_nobias") + (c.adam ? "_adam" : "_sgd");
}

class DenseParity : public ::testing::TestWithParam<Case> {};

TEST_P(DenseParity, MatchesUnshardedModel) {
  const Case& c = GetParam();
  torch::manual_seed(1234);
  auto reference = std::make_shared<MLPImpl>(8, 12, 4, c.bias);
  reference->to(c.dtype);
  parity::Setup s;
  s.world = c.world;
  s.dtype = c.dtype;
  s.adam = c.adam;
  for (int step = 0; step < s.steps; ++step) s.inputs.push_back({torch::randn({5, 8}, c.dtype)});
  s.forward = [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
    return dynamic_cast<MLPImpl&>(m).forward(in[0]);
  };
  const Splits& splits = c.config.splits;
  s.local = [&splits](const std::string& name, const torch::Tensor& full, int rank, int world) {
    auto it = splits.find(name);
    return it == splits.end() ? full : shardplan::shard_of(full, it->second, world, rank);
  };
  for (const auto& f : parity::compare(reference, plan_for(c.config, c.bias), s)) ADD_FAILURE() << f;
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (const auto& config : configs())
    for (int world : {1, 2, 4})
      for (auto dtype : {torch::kDouble, torch::kFloat})
        for (bool bias : {true, false}) out.push_back({world, dtype, bias, false, config});
  // Adam's state is elementwise, so shards must follow it exactly too.
  out.push_back({2, torch::kDouble, true, true, configs()[2]});
  out.push_back({4, torch::kFloat, true, true, configs()[2]});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Dense, DenseParity, ::testing::ValuesIn(all_cases()), case_name);

// ---------------------------------------------------------------- bad plans

struct VanillaMLPImpl : torch::nn::Module {
  VanillaMLPImpl() { fc1 = register_module("fc1", torch::nn::Linear(8, 12)); }
  torch::nn::Linear fc1{nullptr};
};

struct CustomImpl : torch::nn::Module {
  CustomImpl() { scale = register_parameter("scale", torch::ones({4})); }
  torch::Tensor scale;
};

std::string check_error(torch::nn::Module& m, const std::string& rules, int world = 2) {
  try {
    shardplan::check_plan(m, shardplan::parse_plan("mesh: {model: auto}\nrules:\n" + rules, "bad.yaml"), world);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(DensePlan, VanillaTorchLinearIsRejectedNamingTheTypeToUse) {
  VanillaMLPImpl m;
  auto msg = check_error(m, "  - {match: 'fc1\\.weight', layout: [model, null]}\n");
  EXPECT_NE(msg.find("parameter 'fc1.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("torch::nn::LinearImpl"), std::string::npos) << msg;
  EXPECT_NE(msg.find("build the model with shardplan::nn::Linear"), std::string::npos) << msg;
}

TEST(DensePlan, TypeWithoutPluginIsRejected) {
  CustomImpl m;
  auto msg = check_error(m, "  - {match: 'scale', layout: [model]}\n");
  EXPECT_NE(msg.find("parameter 'scale'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no layer plugin handles"), std::string::npos) << msg;
}

TEST(DensePlan, NonDivisibleDimNamesParameterAndRule) {
  MLP m(8, 12, 4, true);
  auto msg = check_error(*m, "  - {match: 'fc2\\.weight', layout: [model, null]}\n", 3);
  EXPECT_NE(msg.find("bad.yaml:3:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'fc2.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("out_features 4 is not divisible by mesh axis 'model' of size 3"), std::string::npos) << msg;
}

TEST(DensePlan, InconsistentBiasAndMisplacedOptionsAreRejected) {
  MLP m(8, 12, 4, true);
  auto bias = check_error(*m,
                          "  - {match: 'fc1\\.weight', layout: [model, null]}\n"
                          "  - {match: 'fc1\\.bias', layout: [null]}\n");
  EXPECT_NE(bias.find("must follow its weight"), std::string::npos) << bias;
  auto row_bias = check_error(*m,
                              "  - {match: 'fc1\\.weight', layout: [null, model]}\n"
                              "  - {match: 'fc1\\.bias', layout: [model]}\n");
  EXPECT_NE(row_bias.find("must be replicated"), std::string::npos) << row_bias;
  auto opt = check_error(*m, "  - {match: 'fc1\\.weight', layout: [null, model], output: sharded}\n");
  EXPECT_NE(opt.find("option 'output'"), std::string::npos) << opt;
  auto both = check_error(*m, "  - {match: 'fc1\\.weight', layout: [model, model]}\n");
  EXPECT_FALSE(both.empty());
}

TEST(DensePlan, ReportGivesLocalShapesAndBytes) {
  MLP m(8, 12, 4, true);
  auto plan = plan_for(configs()[2]);
  auto report = shardplan::check_plan(*m, plan, 4);
  ASSERT_EQ(report.rows.size(), 4u);
  EXPECT_EQ(report.rows[0].path, "fc1.weight");
  EXPECT_EQ(report.rows[0].local_shape, (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(report.rows[1].local_shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(report.rows[2].local_shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(report.rows[3].local_shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(report.rows[0].plugin, "dense");
  EXPECT_EQ(report.global_bytes(), (96 + 12 + 48 + 4) * 4);
  EXPECT_EQ(report.local_bytes(), (24 + 3 + 12 + 4) * 4);
}

TEST(DensePlan, BlockedColumnKeepsBlocksTogether) {
  // A fused QKV projection: 3 blocks of 4 rows each, split over 2 ranks. The
  // gathered output must equal the unsharded one (block-major order).
  torch::manual_seed(3);
  struct QKVImpl : torch::nn::Cloneable<QKVImpl> {
    QKVImpl() { reset(); }
    void reset() override { qkv = register_module("qkv", Linear(6, 12)); }
    Linear qkv{nullptr};
  };
  auto reference = std::make_shared<QKVImpl>();
  reference->to(torch::kDouble);
  auto x = torch::randn({3, 6}, torch::kDouble);
  auto expected = reference->qkv->forward(x);
  auto plan = shardplan::parse_plan(
      "mesh: {model: auto}\nrules:\n  - {match: 'qkv\\.weight', layout: [model, null], blocks: 3}\n");
  std::vector<std::shared_ptr<QKVImpl>> replicas;
  for (int r = 0; r < 2; ++r) replicas.push_back(std::dynamic_pointer_cast<QKVImpl>(reference->clone()));
  std::vector<torch::Tensor> locals(2), outs(2);
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& world) {
    auto m = replicas[world.rank()];
    shardplan::parallelize(*m, plan, world);
    locals[world.rank()] = m->qkv->weight.detach().clone();
    outs[world.rank()] = m->qkv->forward(x).detach();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_LE(parity::rel_err(outs[r], expected), 1e-12);
    // Rank r holds rows [2r, 2r+2) of each of q, k and v.
    auto w = reference->qkv->weight.detach();
    auto want = torch::cat({w.narrow(0, 2 * r, 2), w.narrow(0, 4 + 2 * r, 2), w.narrow(0, 8 + 2 * r, 2)});
    EXPECT_TRUE(torch::equal(locals[r], want)) << "rank " << r;
  }
}

}  // namespace

}  // namespace test_dense
