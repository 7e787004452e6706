// auto_plan on attention built from separate q/k/v Linears: on the example
// Llama (kv_heads 4, 2 and 1 at 2 and 4 ranks) it makes every decision
// plans/llama.yaml makes — the same layout, shard, plugin note and options
// per parameter on every rank, head_dim learned from the probe, k and v's
// heads replicated when the axis exceeds them — and trains like one process
// (float64, 1e-10); heads that do not divide, and heads that do not stay
// apart (another kv mapping), stay replicated with the reason.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "llama_fixture.h"
#include "models/llama.h"
#include "parity.h"
#include "shardplan/auto_plan.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/tensor_parallel.h"

namespace test_auto_plan_llama {

namespace {

namespace ex = shardplan::examples;
using llama_fixture::build;
using llama_fixture::config;
using shardplan::Plan;

using llama_fixture::auto_plan_of;

// The first rule matching `path` (the one that applies), or null.
const shardplan::Rule* rule_for(const Plan& p, const std::string& path) {
  for (const auto& r : p.rules)
    if (r.matches(path)) return &r;
  return nullptr;
}

std::map<std::string, std::string> options_for(const Plan& p, const std::string& path) {
  std::map<std::string, std::string> out;
  if (const auto* r = rule_for(p, path))
    for (const auto& [k, v] : r->options) out[k] = v.value;
  return out;
}

std::string splits_str(const shardplan::ReportRow& row) {
  std::string s;
  for (const auto& x : row.splits)
    s += std::to_string(x.dim) + x.axis + std::to_string(x.index) + "/" + std::to_string(x.parts) + "x" +
         std::to_string(x.blocks) + " ";
  return s;
}

TEST(AutoPlanLlama, MakesTheWrittenPlansDecisions) {
  for (int kv : {4, 2, 1})
    for (int world : {2, 4}) {
      SCOPED_TRACE("kv_heads " + std::to_string(kv) + " world " + std::to_string(world));
      auto m = build(config(kv));
      const Plan automatic = auto_plan_of(*m, world), hand = llama_fixture::plan("llama", 8);
      EXPECT_EQ(automatic.comment.find("self_attn"), std::string::npos) << automatic.comment;
      for (int rank = 0; rank < world; ++rank) {
        const auto a = shardplan::check_plan(*m, automatic, world, rank);
        const auto b = shardplan::check_plan(*m, hand, world, rank);
        ASSERT_EQ(a.rows.size(), b.rows.size()) << automatic.to_yaml();
        for (size_t i = 0; i < a.rows.size(); ++i) {
          const auto &x = a.rows[i], &y = b.rows[i];
          ASSERT_EQ(x.path, y.path);
          EXPECT_EQ(x.layout, y.layout) << x.path;
          EXPECT_EQ(x.local_shape, y.local_shape) << x.path << " rank " << rank;
          EXPECT_EQ(x.plugin, y.plugin) << x.path;
          EXPECT_EQ(x.note, y.note) << x.path;
          EXPECT_EQ(splits_str(x), splits_str(y)) << x.path << " rank " << rank;
        }
      }
      // The options too. The written plan names replicate_heads on k and v
      // for every world size; it acts only where the axis exceeds the kv
      // heads, and only there does auto_plan write it.
      for (const auto& row : shardplan::check_plan(*m, hand, world).rows) {
        auto want = options_for(hand, row.plan_path);
        if (kv % world == 0) want.erase("replicate_heads");
        EXPECT_EQ(options_for(automatic, row.plan_path), want) << row.path << "\n" << automatic.to_yaml();
      }
    }
}

TEST(AutoPlanLlama, TrainsLikeOneProcessFloat64) {
  for (int kv : {4, 2, 1})
    for (int world : {2, 4}) {
      auto m = build(config(kv));
      const auto setup = llama_fixture::setup(world, torch::kDouble, kv);
      const auto failures = parity::compare(m, auto_plan_of(*m, world), setup);
      EXPECT_TRUE(failures.empty()) << "kv_heads " << kv << " world " << world << ":\n"
                                    << ::testing::PrintToString(failures);
    }
}

TEST(AutoPlanLlama, HeadsThatDoNotDivideStayReplicatedWithTheReason) {
  auto six = config(6);
  six["heads"] = "6";
  six["embed"] = "48";
  const Plan p = auto_plan_of(*build(six), 4);
  EXPECT_NE(p.comment.find("model.layers.0.self_attn.o_proj: its attention is not split by heads: 6 query heads "
                           "of 8 do not divide among 4 ranks"),
            std::string::npos)
      << p.comment;
  EXPECT_EQ(rule_for(p, "model.layers.1.self_attn.q_proj.weight"), nullptr) << p.to_yaml();
  EXPECT_NE(rule_for(p, "model.layers.1.mlp.down_proj.weight"), nullptr) << p.to_yaml();

  auto three = six;
  three["kv_heads"] = "3";
  const Plan q = auto_plan_of(*build(three), 2);
  EXPECT_NE(q.comment.find("model.layers.1.self_attn.k_proj: its attention into model.layers.1.self_attn.o_proj is "
                           "not split by heads: model.layers.1.self_attn.k_proj's 3 heads of 8 neither divide among "
                           "2 ranks nor the ranks among them"),
            std::string::npos)
      << q.comment;
  EXPECT_EQ(rule_for(q, "model.layers.0.self_attn.v_proj.weight"), nullptr) << q.to_yaml();
}

// The head size written is the model's (4 heads of 16 here), so the
// dense plugin, which holds it to the model's, takes the plan; a Linear
// that declares another head size than the probe sees keeps its attention
// replicated, with both sizes.
TEST(AutoPlanLlama, WritesTheModelsHeadSize) {
  auto c = config(2);
  c["embed"] = "64";
  for (int world : {2, 4}) {
    auto m = build(c);
    const Plan p = auto_plan_of(*m, world);
    EXPECT_EQ(options_for(p, "model.layers.0.self_attn.q_proj.weight")["head_dim"], "16") << p.to_yaml();
    EXPECT_EQ(options_for(p, "model.layers.1.self_attn.o_proj.weight")["head_dim"], "16") << p.to_yaml();
    EXPECT_NO_THROW(shardplan::check_plan(*m, p, world));
  }
  auto m = build(config(2));
  m->model->layers[0]->as<ex::LlamaDecoderLayerImpl>()->self_attn->q_proj->out_head_dim = 4;
  const Plan q = auto_plan_of(*m, 2);
  EXPECT_NE(q.comment.find("model.layers.0.self_attn.o_proj: its attention is not split by heads: the model says "
                           "model.layers.0.self_attn.q_proj's heads are of 4, but its context is reshaped from "
                           "heads of 8"),
            std::string::npos)
      << q.comment;
  EXPECT_EQ(rule_for(q, "model.layers.0.self_attn.q_proj.weight"), nullptr) << q.to_yaml();
  EXPECT_NE(rule_for(q, "model.layers.1.self_attn.q_proj.weight"), nullptr) << q.to_yaml();
}

// Grouped-query attention of the test's own, with biases: query head j reads
// kv head j / 2 (interleaved, as Llama) or j % 2 (tiled). Heads of 4.
struct GqaImpl : torch::nn::Cloneable<GqaImpl> {
  explicit GqaImpl(bool interleaved_) : interleaved(interleaved_) { reset(); }
  void reset() override {
    q = register_module("q", shardplan::nn::Linear(16, 16));
    k = register_module("k", shardplan::nn::Linear(16, 8));
    v = register_module("v", shardplan::nn::Linear(16, 8));
    o = register_module("o", shardplan::nn::Linear(16, 16));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto heads = [](const torch::Tensor& y) { return y.view({y.size(0), y.size(1), -1, 4}).transpose(1, 2); };
    auto qh = heads(q(x)), kh = heads(k(x)), vh = heads(v(x));
    const int64_t g = qh.size(1) / kh.size(1);
    kh = interleaved ? kh.repeat_interleave(g, 1) : kh.repeat({1, g, 1, 1});
    vh = interleaved ? vh.repeat_interleave(g, 1) : vh.repeat({1, g, 1, 1});
    auto ctx = torch::matmul(torch::softmax(torch::matmul(qh, kh.transpose(-2, -1)) / 2.0, -1), vh);
    return o(ctx.transpose(1, 2).reshape({x.size(0), x.size(1), -1}));
  }
  bool interleaved;
  shardplan::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
};

TEST(AutoPlanLlama, HeadsAreSplitOnlyWhereTheProbeShowsThemApart) {
  const auto x = torch::randn({2, 5, 16}, torch::kDouble);
  for (bool interleaved : {true, false})
    for (int world : {2, 4}) {
      SCOPED_TRACE(std::string(interleaved ? "interleaved" : "tiled") + " at " + std::to_string(world));
      torch::manual_seed(6);
      auto m = std::make_shared<GqaImpl>(interleaved);
      m->to(torch::kDouble);
      shardplan::AutoPlanOptions o;
      o.probe = [x](torch::nn::Module& mod) { return dynamic_cast<GqaImpl&>(mod).forward(x); };
      const Plan p = shardplan::auto_plan(*m, world, o);
      if (!interleaved) {
        // At 2 ranks rank 0 holds kv head 0, but its query heads 0 and 1
        // read kv heads 0 and 1; at 4 rank 1's query head reads kv head 1.
        EXPECT_TRUE(p.rules.empty()) << p.to_yaml();
        EXPECT_NE(p.comment.find("o: its attention is not split by heads: the heads do not stay apart at " +
                                 std::to_string(world) + " ranks"),
                  std::string::npos)
            << p.comment;
        continue;
      }
      const std::map<std::string, std::string> column = {{"output", "sharded"}, {"head_dim", "4"}};
      EXPECT_EQ(options_for(p, "q.weight"), column);
      auto kv = column;
      if (world == 4) kv["replicate_heads"] = "true";
      EXPECT_EQ(options_for(p, "v.weight"), kv);
      const std::map<std::string, std::string> row = {{"input", "sharded"}, {"head_dim", "4"}};
      EXPECT_EQ(options_for(p, "o.weight"), row);
      // Replicated heads keep their bias whole: no rule for it.
      EXPECT_EQ(rule_for(p, "k.bias") == nullptr, world == 4) << p.to_yaml();
      shardplan::TensorParallel tp(std::dynamic_pointer_cast<GqaImpl>(m->clone()), p,
                                   std::vector<std::string>(static_cast<size_t>(world), "cpu"));
      EXPECT_LT(parity::rel_err(tp->forward({x}), m->forward(x)), 1e-12);
    }
}

}  // namespace

}  // namespace test_auto_plan_llama
