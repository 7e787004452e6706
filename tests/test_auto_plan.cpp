// shardplan::auto_plan: the plans it writes for small models with known
// answers (the Megatron MLP, a gated MLP), for the odd ones where it must be
// conservative (a residual read of a split activation, a Linear used twice,
// a LayerNorm in between), for the example models (the same layouts as the
// hand-written plans, no more bytes per step), and every plan run sharded
// against the same model unsharded: outputs, input gradients and parameters
// after three SGD steps, float64.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "models/convnet.h"
#include "plan_rules.h"
#include "models/gpt.h"
#include "models/lstm_lm.h"
#include "models/model.h"
#include "shardplan/auto_plan.h"
#include "shardplan/dry_run.h"
#include "shardplan/error.h"
#include "shardplan/nn/gelu.h"
#include "shardplan/nn/linear.h"
#include "shardplan/nn/multihead_attention.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/tensor_parallel.h"
#include "shardplan/world.h"

namespace test_auto_plan {

namespace {

namespace ex = shardplan::examples;
using shardplan::Plan;

std::vector<std::string> cpus(int n) { return std::vector<std::string>(static_cast<size_t>(n), "cpu"); }

// |a - b| / |b| over the whole tensor: float64 reductions in another order
// differ in the last bits of the largest elements, not of every element.
bool close(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.norm().item<double>(), 1e-300);
  return (a - b).norm().item<double>() / scale < 1e-10;
}

// The sharded model (the in-process wrapper at `world` ranks) against the
// unsharded one: outputs, input gradients, and every parameter after three
// SGD steps.
template <class Impl>
void expect_matches_unsharded(const std::shared_ptr<Impl>& ref, const Plan& plan, int world,
                              const std::vector<torch::Tensor>& inputs, const shardplan::ReplicaForward& forward) {
  auto copy = std::dynamic_pointer_cast<Impl>(ref->clone());
  shardplan::TensorParallel tp(std::shared_ptr<torch::nn::Module>(copy), plan, cpus(world), forward);
  // A module registered under two paths lists its parameters twice: step each once.
  std::vector<torch::Tensor> unique;
  for (const auto& t : ref->parameters())
    if (std::none_of(unique.begin(), unique.end(), [&](const torch::Tensor& u) { return u.is_same(t); }))
      unique.push_back(t);
  torch::optim::SGD opt_ref(unique, 0.01), opt_tp(tp->parameters(), 0.01);
  for (int step = 0; step < 3; ++step) {
    std::vector<torch::Tensor> a, b;
    for (const auto& x : inputs) {
      a.push_back(x.is_floating_point() ? x.clone().requires_grad_(true) : x);
      b.push_back(x.is_floating_point() ? x.clone().requires_grad_(true) : x);
    }
    auto y_ref = forward(*ref, a);
    auto y_tp = tp->forward(b);
    ASSERT_EQ(y_ref.sizes(), y_tp.sizes());
    EXPECT_TRUE(close(y_tp, y_ref)) << "output, step " << step;
    auto weights = torch::linspace(0.5, 1.5, y_ref.numel(), y_ref.options()).view(y_ref.sizes());
    opt_ref.zero_grad();
    opt_tp.zero_grad();
    (y_ref * weights).sum().backward();
    (y_tp * weights).sum().backward();
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].is_floating_point())
        EXPECT_TRUE(close(b[i].grad(), a[i].grad())) << "input " << i << " grad, step " << step;
    opt_ref.step();
    opt_tp.step();
  }
  auto got = tp->state_dict();
  for (const auto& p : ref->named_parameters()) {
    ASSERT_TRUE(got.contains(p.key())) << p.key();
    EXPECT_TRUE(close(got[p.key()], p.value()))
        << p.key() << ": max difference " << (p.value() - got[p.key()]).abs().max().template item<double>() << " of "
        << p.value().abs().max().template item<double>();
  }
}

template <class M>
shardplan::ReplicaForward forward_of() {
  return [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) { return dynamic_cast<M&>(m).forward(in[0]); };
}

template <class M>
Plan planned(const std::shared_ptr<M>& model, int world, const torch::Tensor& x) {
  shardplan::AutoPlanOptions o;
  o.probe = [x](torch::nn::Module& m) { return dynamic_cast<M&>(m).forward(x); };
  return shardplan::auto_plan(*model, world, o);
}

// ------------------------------------------------------------ small models

struct MlpImpl : torch::nn::Cloneable<MlpImpl> {
  MlpImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", shardplan::nn::Linear(8, 16));
    fc2 = register_module("fc2", shardplan::nn::Linear(16, 16));
    fc3 = register_module("fc3", shardplan::nn::Linear(16, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3->forward(torch::relu(fc2->forward(torch::relu(fc1->forward(x)))));
  }
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

TEST(AutoPlan, MlpIsTheMegatronPairAndMatchesUnsharded) {
  torch::manual_seed(1);
  auto m = std::make_shared<MlpImpl>();
  m->to(torch::kDouble);
  auto x = torch::randn({5, 8}, torch::kDouble);
  const Plan p = planned(m, 2, x);
  EXPECT_EQ(rules_of(p), (std::vector<std::string>{"fc1\\.weight: [model, null] output=sharded",
                                                   "fc1\\.bias: [model]", "fc2\\.weight: [null, model] input=sharded"}));
  // Every rule says why; the header says what stayed replicated.
  for (const auto& r : p.rules) EXPECT_FALSE(r.comment.empty()) << r.pattern;
  EXPECT_NE(p.rules[0].comment.find("only fc2 reads it (through relu)"), std::string::npos) << p.rules[0].comment;
  EXPECT_NE(p.comment.find("fc3: its producer fc2 is already sharded"), std::string::npos) << p.comment;
  // The YAML carries the comments and parses back to the same rules.
  const std::string yaml = p.to_yaml();
  EXPECT_NE(yaml.find("# Generated by shardplan::auto_plan for 2 ranks"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  # column-parallel fc1"), std::string::npos) << yaml;
  EXPECT_EQ(rules_of(shardplan::parse_plan(yaml)), rules_of(p));
  for (int world : {1, 2, 4})
    expect_matches_unsharded(std::dynamic_pointer_cast<MlpImpl>(m->clone()), planned(m, world, x),
                             world, {x}, forward_of<MlpImpl>());
}

TEST(AutoPlan, TensorParallelWithoutAPlanUsesTheAutoPlan) {
  torch::manual_seed(2);
  auto m = std::make_shared<MlpImpl>();
  m->to(torch::kDouble);
  auto x = torch::randn({3, 8}, torch::kDouble);
  shardplan::TensorParallel tp(std::dynamic_pointer_cast<MlpImpl>(m->clone()), {"cpu", "cpu"}, {x});
  EXPECT_NE(tp->report(0).plan_yaml.find("fc1"), std::string::npos);
  EXPECT_TRUE(torch::allclose(tp->forward(x), m->forward(x), 1e-10, 1e-12));
  // No example input: no probe, so no pairs (and nothing else here).
  shardplan::TensorParallel bare(std::dynamic_pointer_cast<MlpImpl>(m->clone()), {"cpu", "cpu"});
  EXPECT_NE(bare->report(0).plan_yaml.find("rules: []"), std::string::npos) << bare->report(0).plan_yaml;
  EXPECT_NE(bare->report(0).plan_yaml.find("without a probe forward"), std::string::npos);
}

// y = fc3(x + fc2(gelu(fc1(x)))): the residual reads x, not the split
// activation, so fc1/fc2 pair; fc3's input is not only layers' outputs.
// shardplan_gelu: shardplan::gelu (a custom autograd node in float64) in
// place of torch's.
struct ResidualImpl : torch::nn::Cloneable<ResidualImpl> {
  explicit ResidualImpl(bool shardplan_gelu_ = false) : shardplan_gelu(shardplan_gelu_) { reset(); }
  void reset() override {
    fc1 = register_module("fc1", shardplan::nn::Linear(8, 12));
    fc2 = register_module("fc2", shardplan::nn::Linear(12, 8));
    fc3 = register_module("fc3", shardplan::nn::Linear(8, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor h = fc1->forward(x);
    return fc3->forward(x + fc2->forward(shardplan_gelu ? shardplan::gelu(h) : torch::gelu(h)));
  }
  bool shardplan_gelu;
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

// h = fc1(x); y = fc3(fc2(relu(h)) + h): h is read whole by the residual add,
// so fc1's output may not stay split: no pair at all.
struct SplitReadTwiceImpl : torch::nn::Cloneable<SplitReadTwiceImpl> {
  SplitReadTwiceImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", shardplan::nn::Linear(8, 8));
    fc2 = register_module("fc2", shardplan::nn::Linear(8, 8));
    fc3 = register_module("fc3", shardplan::nn::Linear(8, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = fc1->forward(x);
    return fc3->forward(fc2->forward(torch::relu(h)) + h);
  }
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

// fc1 applied twice, then fc2: a Linear used twice is never half a pair.
struct UsedTwiceImpl : torch::nn::Cloneable<UsedTwiceImpl> {
  UsedTwiceImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", shardplan::nn::Linear(8, 8));
    fc2 = register_module("fc2", shardplan::nn::Linear(8, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::relu(fc1->forward(torch::tanh(fc1->forward(x))))); }
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// A LayerNorm between two Linears needs the whole activation.
struct NormBetweenImpl : torch::nn::Cloneable<NormBetweenImpl> {
  NormBetweenImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", shardplan::nn::Linear(8, 8));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
    fc2 = register_module("fc2", shardplan::nn::Linear(8, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(ln->forward(fc1->forward(x))); }
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::LayerNorm ln{nullptr};
};

// SwiGLU: down(silu(gate(x)) * up(x)): two column-parallel producers joined
// elementwise, one row-parallel consumer.
struct GatedImpl : torch::nn::Cloneable<GatedImpl> {
  GatedImpl() { reset(); }
  void reset() override {
    gate = register_module("gate", shardplan::nn::Linear(8, 12));
    up = register_module("up", shardplan::nn::Linear(torch::nn::LinearOptions(8, 12).bias(false)));
    down = register_module("down", shardplan::nn::Linear(12, 8));
  }
  torch::Tensor forward(const torch::Tensor& x) { return down->forward(torch::silu(gate->forward(x)) * up->forward(x)); }
  shardplan::nn::Linear gate{nullptr}, up{nullptr}, down{nullptr};
};

TEST(AutoPlan, ResidualAroundAPairKeepsThePair) {
  for (bool shardplan_gelu : {false, true}) {
    SCOPED_TRACE(shardplan_gelu ? "shardplan::gelu" : "torch::gelu");
    torch::manual_seed(3);
    auto m = std::make_shared<ResidualImpl>(shardplan_gelu);
    m->to(torch::kDouble);
    auto x = torch::randn({4, 8}, torch::kDouble);
    const Plan p = planned(m, 2, x);
    EXPECT_EQ(rules_of(p), (std::vector<std::string>{"fc1\\.weight: [model, null] output=sharded", "fc1\\.bias: [model]",
                                                     "fc2\\.weight: [null, model] input=sharded"}));
    EXPECT_NE(p.comment.find("fc3: "), std::string::npos) << p.comment;
    for (int world : {2, 4}) expect_matches_unsharded(m, planned(m, world, x), world, {x}, forward_of<ResidualImpl>());
  }
}

TEST(AutoPlan, ActivationReadWholeElsewhereIsNotSplit) {
  torch::manual_seed(4);
  auto m = std::make_shared<SplitReadTwiceImpl>();
  m->to(torch::kDouble);
  auto x = torch::randn({4, 8}, torch::kDouble);
  const Plan p = planned(m, 2, x);
  EXPECT_TRUE(p.rules.empty()) << p.to_yaml();
  EXPECT_NE(p.comment.find("\n  fc2: fc1's output is also read by add (a residual), which needs it whole\n"),
            std::string::npos)
      << p.comment;
  // fc1 is the first layer, but that is not why it stays replicated.
  EXPECT_NE(p.comment.find("\n  fc1: its pair with fc2 is refused: fc1's output is also read by add (a residual), "
                           "which needs it whole\n"),
            std::string::npos)
      << p.comment;
  EXPECT_EQ(p.comment.find("not computed from another layer"), std::string::npos) << p.comment;
  EXPECT_NE(p.comment.find("Nothing to shard"), std::string::npos) << p.comment;
  expect_matches_unsharded(m, p, 2, {x}, forward_of<SplitReadTwiceImpl>());
}

TEST(AutoPlan, LinearUsedTwiceStaysReplicated) {
  torch::manual_seed(5);
  auto m = std::make_shared<UsedTwiceImpl>();
  m->to(torch::kDouble);
  auto x = torch::randn({4, 8}, torch::kDouble);
  const Plan p = planned(m, 2, x);
  EXPECT_TRUE(p.rules.empty()) << p.to_yaml();
  EXPECT_NE(p.comment.find("fc1: it runs 2 times in the probe"), std::string::npos) << p.comment;
  EXPECT_NE(p.comment.find("fc2: its producer fc1 runs 2 times"), std::string::npos) << p.comment;
  expect_matches_unsharded(m, p, 2, {x}, forward_of<UsedTwiceImpl>());
}

TEST(AutoPlan, NormBetweenLinearsBreaksThePair) {
  torch::manual_seed(6);
  auto m = std::make_shared<NormBetweenImpl>();
  m->to(torch::kDouble);
  auto x = torch::randn({4, 8}, torch::kDouble);
  const Plan p = planned(m, 2, x);
  EXPECT_TRUE(p.rules.empty()) << p.to_yaml();
  EXPECT_NE(p.comment.find("fc2: its input passes through native_layer_norm"), std::string::npos) << p.comment;
}

TEST(AutoPlan, GatedMlpSplitsBothProducers) {
  torch::manual_seed(7);
  auto m = std::make_shared<GatedImpl>();
  m->to(torch::kDouble);
  auto x = torch::randn({4, 8}, torch::kDouble);
  const Plan p = planned(m, 2, x);
  EXPECT_EQ(rules_of(p), (std::vector<std::string>{"gate\\.weight: [model, null] output=sharded",
                                                   "gate\\.bias: [model]", "up\\.weight: [model, null] output=sharded",
                                                   "down\\.weight: [null, model] input=sharded"}));
  for (int world : {2, 4}) expect_matches_unsharded(m, planned(m, world, x), world, {x}, forward_of<GatedImpl>());
}

// Self-attention then an MLP; attention needs no probe, the pair does.
struct AttentionImpl : torch::nn::Cloneable<AttentionImpl> {
  explicit AttentionImpl(int64_t heads = 4) : heads(heads) { reset(); }
  void reset() override {
    attn = register_module("attn", shardplan::nn::MultiheadAttention(8, heads));
    fc1 = register_module("fc1", shardplan::nn::Linear(8, 16));
    fc2 = register_module("fc2", shardplan::nn::Linear(16, 8));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = x + std::get<0>(attn->forward(x, x, x, {}, false));
    return y + fc2->forward(torch::relu(fc1->forward(y)));
  }
  int64_t heads;
  shardplan::nn::MultiheadAttention attn{nullptr};
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr};
};

TEST(AutoPlan, AttentionIsHeadParallelWithOrWithoutAProbe) {
  torch::manual_seed(8);
  auto m = std::make_shared<AttentionImpl>();
  m->to(torch::kDouble);
  auto x = torch::randn({5, 2, 8}, torch::kDouble);
  const std::vector<std::string> attention = {"attn\\.in_proj_weight: [model, null]", "attn\\.in_proj_bias: [model]",
                                              "attn\\.out_proj\\.weight: [null, model] input=sharded"};
  EXPECT_EQ(rules_of(shardplan::auto_plan(*m, 2)), attention);
  auto with_pair = attention;
  with_pair.insert(with_pair.end(), {"fc1\\.weight: [model, null] output=sharded", "fc1\\.bias: [model]",
                                     "fc2\\.weight: [null, model] input=sharded"});
  const Plan p = planned(m, 2, x);
  EXPECT_EQ(rules_of(p), with_pair);
  for (int world : {2, 4}) expect_matches_unsharded(m, planned(m, world, x), world, {x}, forward_of<AttentionImpl>());
}

TEST(AutoPlan, WhatAPluginRejectsStaysReplicatedWithItsReason) {
  torch::manual_seed(9);
  auto m = std::make_shared<AttentionImpl>(2);  // 2 heads cannot be split 4 ways
  m->to(torch::kDouble);
  auto x = torch::randn({5, 2, 8}, torch::kDouble);
  const Plan p = planned(m, 4, x);
  EXPECT_EQ(rules_of(p), (std::vector<std::string>{"fc1\\.weight: [model, null] output=sharded",
                                                   "fc1\\.bias: [model]", "fc2\\.weight: [null, model] input=sharded"}));
  EXPECT_NE(p.comment.find("attn: rejected at 4 ranks: "), std::string::npos) << p.comment;
  expect_matches_unsharded(m, p, 4, {x}, forward_of<AttentionImpl>());
}

struct VanillaImpl : torch::nn::Cloneable<VanillaImpl> {
  VanillaImpl() { reset(); }
  void reset() override { fc = register_module("fc", torch::nn::Linear(4, 4)); }
  torch::Tensor forward(const torch::Tensor& x) { return fc->forward(x); }
  torch::nn::Linear fc{nullptr};
};

TEST(AutoPlan, NothingToShardIsSaidAndStillRuns) {
  auto m = std::make_shared<VanillaImpl>();
  m->to(torch::kDouble);
  auto x = torch::randn({2, 4}, torch::kDouble);
  const Plan p = planned(m, 2, x);
  EXPECT_TRUE(p.rules.empty());
  EXPECT_NE(p.comment.find("Nothing to shard"), std::string::npos) << p.comment;
  EXPECT_NE(p.comment.find("fc: a torch::nn::Linear, which cannot be sharded: build the model with shardplan::nn::Linear"),
            std::string::npos)
      << p.comment;
  expect_matches_unsharded(m, p, 2, {x}, forward_of<VanillaImpl>());
}

TEST(AutoPlan, BadInputGetsClearErrors) {
  auto m = std::make_shared<MlpImpl>();
  shardplan::AutoPlanOptions o;
  o.probe = [](torch::nn::Module& mod) { return dynamic_cast<MlpImpl&>(mod).forward(torch::zeros({2, 3})); };
  try {
    shardplan::auto_plan(*m, 2, o);
    FAIL() << "no error";
  } catch (const shardplan::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("auto_plan: the probe forward failed: ", 0), 0u) << e.what();
  }
  // The model comes back untouched after a failed probe: it still runs.
  EXPECT_NO_THROW(m->forward(torch::zeros({2, 8})));
  EXPECT_TRUE(m->is_training());
  EXPECT_THROW(shardplan::auto_plan(*m, 0), shardplan::Error);
  // Already sharded: planning it again would describe shards as models.
  auto tp = shardplan::TensorParallel(std::dynamic_pointer_cast<MlpImpl>(m->clone()), {"cpu", "cpu"}, {torch::zeros({1, 8})});
  try {
    shardplan::auto_plan(*tp->replica(0), 2);
    FAIL() << "no error";
  } catch (const shardplan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("is already sharded"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------ example models

const std::map<std::string, ex::Overrides> kConfigs = {
    {"gpt", {{"vocab", "32"}, {"context", "8"}, {"embed", "16"}, {"heads", "4"}, {"layers", "2"}, {"mlp", "24"}}},
    {"convnet", {{"channels", "2"}, {"size", "6"}, {"conv1", "8"}, {"conv2", "8"}, {"hidden", "12"}, {"classes", "4"}}},
    {"lstm_lm", {{"vocab", "32"}, {"context", "6"}, {"embed", "8"}, {"hidden", "12"}, {"layers", "2"}}}};

ex::Batch batch_of(const ex::ModelHandle& h, const std::string& name, const ex::Overrides& c, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  if (name == "convnet") return h.model->sample(gen, 4, nullptr);
  const int64_t v = std::stoll(c.at("vocab")), t = std::stoll(c.at("context"));
  return {torch::randint(v, {3, t}, gen, torch::kLong), torch::randint(v, {3, t}, gen, torch::kLong)};
}

Plan auto_plan_of(const ex::ModelHandle& h, const std::string& name, int world) {
  shardplan::AutoPlanOptions o;
  const auto batch = batch_of(h, name, kConfigs.at(name), 1);
  o.probe = [batch](torch::nn::Module& m) { return ex::as_example(m.shared_from_this()).model->loss(batch); };
  return shardplan::auto_plan(*h.module, world, o);
}

TEST(AutoPlan, ExampleModelsGetTheHandWrittenLayoutsAndNoMoreBytes) {
  for (const auto& [name, config] : kConfigs) {
    for (int world : {2, 4}) {
      torch::manual_seed(11);
      auto h = ex::make_model(name, config);
      h.module->to(torch::kDouble);
      const Plan automatic = auto_plan_of(h, name, world);
      const Plan hand = shardplan::load_plan(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/" + name + ".yaml");
      // The same layout for every parameter and the loss (options may be
      // spelled differently; the bytes below hold them to account).
      auto a = shardplan::check_plan(*h.module, automatic, world), b = shardplan::check_plan(*h.module, hand, world);
      ASSERT_EQ(a.rows.size(), b.rows.size()) << name;
      for (size_t i = 0; i < a.rows.size(); ++i)
        EXPECT_EQ(a.rows[i].layout, b.rows[i].layout) << name << " at " << world << ": " << a.rows[i].path << "\n"
                                                      << automatic.to_yaml();
      // Bytes one training step hands to collectives, rank 0.
      const auto batch = batch_of(h, name, config, 2);
      auto loss = [batch](torch::nn::Module& m) { return ex::as_example(m.shared_from_this()).model->loss(batch); };
      auto bytes = [&](const Plan& p) {
        std::vector<std::shared_ptr<torch::nn::Module>> replicas;
        for (int r = 0; r < world; ++r) replicas.push_back(h.module->clone());
        return shardplan::measure_step_comm(p, replicas, loss)[0].bytes;
      };
      EXPECT_LE(bytes(automatic), bytes(hand)) << name << " at " << world;
    }
  }
}

TEST(AutoPlan, ExampleModelsUnderTheirAutoPlansMatchUnsharded) {
  for (const auto& [name, config] : kConfigs) {
    torch::manual_seed(12);
    auto h = ex::make_model(name, config);
    h.module->to(torch::kDouble);
    const Plan p = auto_plan_of(h, name, 2);
    const auto batch = batch_of(h, name, config, 3);
    shardplan::ReplicaForward loss = [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
      return ex::as_example(m.shared_from_this()).model->loss({in[0], in[1]});
    };
    expect_matches_unsharded(h.module, p, 2, {batch.input, batch.target}, loss);
  }
}

}  // namespace

namespace {

// One Linear registered under two paths (a shared submodule): parallelize
// would cut it once per path, so it stays replicated, and so does its pair.
struct SharedImpl : torch::nn::Cloneable<SharedImpl> {
  SharedImpl() { reset(); }
  void reset() override {
    enc = register_module("enc", shardplan::nn::Linear(8, 12));
    register_module("alias", enc);
    fc2 = register_module("fc2", shardplan::nn::Linear(12, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::relu(enc->forward(x))); }
  shardplan::nn::Linear enc{nullptr}, fc2{nullptr};
};

TEST(AutoPlan, SharedSubmoduleIsPlannedAlikeUnderEveryPath) {
  torch::manual_seed(13);
  auto m = std::make_shared<SharedImpl>();
  m->to(torch::kDouble);
  auto x = torch::randn({4, 8}, torch::kDouble);
  const Plan p = planned(m, 2, x);
  EXPECT_TRUE(p.rules.empty()) << p.to_yaml();
  EXPECT_NE(p.comment.find("enc: it is registered under 2 paths (enc, alias)"), std::string::npos) << p.comment;
  for (int world : {2, 4}) expect_matches_unsharded(m, planned(m, world, x), world, {x}, forward_of<SharedImpl>());
}

}  // namespace

namespace {

// enc feeds block, one module that runs twice: no pair, and enc says why.
struct SharedConsumerImpl : torch::nn::Cloneable<SharedConsumerImpl> {
  SharedConsumerImpl() { reset(); }
  void reset() override {
    enc = register_module("enc", shardplan::nn::Linear(8, 12));
    block = register_module("block", shardplan::nn::Linear(12, 12));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return block->forward(torch::relu(block->forward(torch::relu(enc->forward(x)))));
  }
  shardplan::nn::Linear enc{nullptr}, block{nullptr};
};

// h = fc1(x) feeds fc2 (through relu) and fc3 (directly): neither pair.
struct TwoConsumersImpl : torch::nn::Cloneable<TwoConsumersImpl> {
  TwoConsumersImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", shardplan::nn::Linear(8, 12));
    fc2 = register_module("fc2", shardplan::nn::Linear(12, 4));
    fc3 = register_module("fc3", shardplan::nn::Linear(12, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = fc1->forward(x);
    auto a = fc2->forward(torch::relu(h));  // before fc3: the planner goes in call order
    return a + fc3->forward(h);
  }
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

// The first layer of a chain left replicated: its header line names what
// refused its pair, not that its input is the model's (true of every first
// half).
TEST(AutoPlan, FirstLayerLeftReplicatedNamesTheRealCause) {
  torch::manual_seed(14);
  auto x = torch::randn({4, 8}, torch::kDouble);
  auto shared = std::make_shared<SharedConsumerImpl>();
  shared->to(torch::kDouble);
  const Plan p = planned(shared, 2, x);
  EXPECT_TRUE(p.rules.empty()) << p.to_yaml();
  EXPECT_NE(p.comment.find("\n  enc: its pair with block is refused: block runs 2 times in the probe "
                           "(a shared consumer)\n"),
            std::string::npos)
      << p.comment;
  EXPECT_NE(p.comment.find("\n  block: it runs 2 times in the probe\n"), std::string::npos) << p.comment;
  EXPECT_EQ(p.comment.find("not computed from another layer"), std::string::npos) << p.comment;

  auto two = std::make_shared<TwoConsumersImpl>();
  two->to(torch::kDouble);
  const Plan q = planned(two, 2, x);
  EXPECT_TRUE(q.rules.empty()) << q.to_yaml();
  EXPECT_NE(q.comment.find("\n  fc1: its pair with fc2 is refused: fc1's output is also read by fc3 (a second "
                           "consumer), which needs it whole\n"),
            std::string::npos)
      << q.comment;
  EXPECT_EQ(q.comment.find("not computed from another layer"), std::string::npos) << q.comment;
}

}  // namespace

}  // namespace test_auto_plan
