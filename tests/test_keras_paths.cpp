// `paths: keras`: rules over Keras-style names in Keras's axis order, mapped
// onto the torch parameters (docs/PLAN_FORMAT.md, "Keras paths").
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardplan/error.h"
#include "shardplan/nn/conv.h"
#include "shardplan/nn/embedding.h"
#include "shardplan/nn/linear.h"
#include "shardplan/nn/lstm.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace test_keras_paths {

namespace {

// The Keras-on-torch seed's example, on a torch model whose layers are
// called dense and dense_1 (Keras's default names).
struct DenseNetImpl : torch::nn::Module {
  DenseNetImpl() {
    dense = register_module("dense", shardplan::nn::Linear(8, 6));
    dense_1 = register_module("dense_1", shardplan::nn::Linear(6, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return dense_1->forward(torch::tanh(dense->forward(x))); }
  shardplan::nn::Linear dense{nullptr}, dense_1{nullptr};
};
TORCH_MODULE(DenseNet);

const char* kSeedPlan =
    "paths: keras\n"
    "mesh: {model: auto}\n"
    "rules:\n"
    "  - {match: 'dense.*kernel', layout: [null, model]}\n"
    "  - {match: 'dense.*bias', layout: [model]}\n";

TEST(KerasPaths, SeedExampleIsColumnParallelAndExact) {
  auto plan = shardplan::parse_plan(kSeedPlan, "keras.yaml");
  EXPECT_EQ(plan.paths, "keras");
  EXPECT_EQ(shardplan::parse_plan(plan.to_yaml()).to_yaml(), plan.to_yaml());
  EXPECT_NE(plan.to_yaml().find("paths: keras"), std::string::npos);

  torch::manual_seed(3);
  DenseNet ref;
  ref->to(torch::kDouble);
  auto x = torch::randn({5, 8}, torch::kDouble).requires_grad_(true);
  auto y_ref = ref->forward(x);
  y_ref.sum().backward();
  for (int ws : {1, 2}) {
    shardplan::run_ranks_in_threads(ws, [&](shardplan::World& world) {
      DenseNet m;
      m->to(torch::kDouble);
      {
        // The reference's weights (the global generator is shared by the rank threads).
        torch::NoGradGuard no_grad;
        auto mine = m->named_parameters();
        for (const auto& p : ref->named_parameters()) mine[p.key()].copy_(p.value());
      }
      auto report = shardplan::parallelize(*m, plan, world);
      for (const auto& row : report.rows) {
        if (row.path == "dense.weight") {
          EXPECT_EQ(row.layout, "[model, null]");  // torch order
          EXPECT_NE(row.note.find("keras dense/kernel [null, model]"), std::string::npos) << row.note;
          EXPECT_EQ(row.local_shape, (std::vector<int64_t>{6 / ws, 8}));
        }
        if (row.path == "dense_1.bias") EXPECT_NE(row.note.find("keras dense_1/bias [model]"), std::string::npos);
      }
      auto xi = x.detach().clone().requires_grad_(true);
      auto y = m->forward(xi);
      EXPECT_TRUE(y.allclose(y_ref, 1e-12, 1e-12));
      y.sum().backward();
      EXPECT_TRUE(xi.grad().allclose(x.grad(), 1e-12, 1e-12));
      const int64_t r = world.rank();
      EXPECT_TRUE(m->dense->weight.grad().allclose(ref->dense->weight.grad().chunk(ws, 0)[r], 1e-12, 1e-12));
      EXPECT_TRUE(m->dense_1->bias.grad().allclose(ref->dense_1->bias.grad().chunk(ws, 0)[r], 1e-12, 1e-12));
    });
  }
}

struct ZooImpl : torch::nn::Module {
  ZooImpl() {
    emb = register_module("emb", shardplan::nn::Embedding(16, 8));
    conv = register_module("conv", shardplan::nn::Conv2d(torch::nn::Conv2dOptions(4, 8, 3)));
    lstm = register_module("lstm", shardplan::nn::LSTM(torch::nn::LSTMOptions(8, 6)));
  }
  shardplan::nn::Embedding emb{nullptr};
  shardplan::nn::Conv2d conv{nullptr};
  shardplan::nn::LSTM lstm{nullptr};
};
TORCH_MODULE(Zoo);

// A Keras-path plan and the torch plan it stands for cut every parameter
// the same way.
TEST(KerasPaths, SameCutsAsTheTorchPlanForConvEmbeddingLstm) {
  const std::string keras =
      "paths: keras\nmesh: {model: auto}\nrules:\n"
      "  - {match: 'emb/embeddings', layout: [model, null]}\n"
      "  - {match: 'conv/kernel', layout: [null, null, null, model]}\n"
      "  - {match: 'conv/bias', layout: [model]}\n"
      "  - {match: 'lstm/(recurrent_)?kernel', layout: [null, model]}\n"
      "  - {match: 'lstm/(recurrent_)?bias', layout: [model]}\n";
  const std::string torch_plan =
      "mesh: {model: auto}\nrules:\n"
      "  - {match: 'emb\\.weight', layout: [model, null]}\n"
      "  - {match: 'conv\\.weight', layout: [model, null, null, null]}\n"
      "  - {match: 'conv\\.bias', layout: [model]}\n"
      "  - {match: 'lstm\\.weight_.*', layout: [model, null]}\n"
      "  - {match: 'lstm\\.bias_.*', layout: [model]}\n";
  Zoo a, b;
  auto ka = shardplan::check_plan(*a, shardplan::parse_plan(keras, "k.yaml"), 2);
  auto tb = shardplan::check_plan(*b, shardplan::parse_plan(torch_plan, "t.yaml"), 2);
  ASSERT_EQ(ka.rows.size(), tb.rows.size());
  std::map<std::string, std::string> keras_of;
  for (size_t i = 0; i < ka.rows.size(); ++i) {
    const auto& k = ka.rows[i];
    const auto& t = tb.rows[i];
    EXPECT_EQ(k.path, t.path);
    EXPECT_EQ(k.layout, t.layout) << k.path;
    EXPECT_EQ(k.local_shape, t.local_shape) << k.path;
    EXPECT_EQ(k.plugin, t.plugin) << k.path;
    ASSERT_EQ(k.splits.size(), t.splits.size()) << k.path;
    for (size_t s = 0; s < k.splits.size(); ++s) {
      EXPECT_EQ(k.splits[s].dim, t.splits[s].dim) << k.path;
      EXPECT_EQ(k.splits[s].blocks, t.splits[s].blocks) << k.path;
    }
    keras_of[k.path] = k.note.substr(0, k.note.find(' ', 6));
  }
  EXPECT_EQ(keras_of["emb.weight"], "keras emb/embeddings");
  EXPECT_EQ(keras_of["conv.weight"], "keras conv/kernel");
  EXPECT_EQ(keras_of["lstm.weight_ih_l0"], "keras lstm/kernel");
  EXPECT_EQ(keras_of["lstm.weight_hh_l0"], "keras lstm/recurrent_kernel");
  EXPECT_EQ(keras_of["lstm.bias_hh_l0"], "keras lstm/recurrent_bias");
}

TEST(KerasPaths, BadInputIsReportedLikeAnyRule) {
  DenseNet m;
  // A rule over a Keras name that matches nothing.
  try {
    shardplan::check_plan(*m,
                          shardplan::parse_plan("paths: keras\nmesh: {model: auto}\nrules:\n"
                                                "  - {match: 'conv.*kernel', layout: [null, model]}\n",
                                                "k.yaml"),
                          2);
    FAIL() << "an unmatched rule was accepted";
  } catch (const shardplan::PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("k.yaml:4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("conv.*kernel"), std::string::npos) << e.what();
  }
  // Torch names do not match under paths: keras.
  EXPECT_THROW(shardplan::check_plan(*m,
                                     shardplan::parse_plan("paths: keras\nmesh: {model: auto}\nrules:\n"
                                                           "  - {match: 'dense\\.weight', layout: [model, null]}\n"),
                                     2),
               shardplan::PlanError);
  // A layout of the wrong rank names the Keras path.
  try {
    shardplan::check_plan(*m,
                          shardplan::parse_plan("paths: keras\nmesh: {model: auto}\nrules:\n"
                                                "  - {match: 'dense/kernel', layout: [model]}\n"),
                          2);
    FAIL() << "a layout of the wrong rank was accepted";
  } catch (const shardplan::PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("dense/kernel"), std::string::npos) << e.what();
  }
  try {
    shardplan::parse_plan("paths: jax\nmesh: {model: auto}\nrules: []\n", "p.yaml");
    FAIL() << "paths: jax was accepted";
  } catch (const shardplan::PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("p.yaml:1:8"), std::string::npos) << e.what();
  }
}

}  // namespace

}  // namespace test_keras_paths
