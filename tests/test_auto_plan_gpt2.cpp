// auto_plan on attention whose q, k and v come from one Linear (GPT-2's
// c_attn, stacked in thirds): on the example GPT-2 at 2 and 4 ranks it makes
// the cut plans/gpt2.yaml writes — c_attn column-parallel by heads in 3
// blocks, c_proj row-parallel, the MLP pair, the tied vocabulary and the
// loss — the same layout, shard and plugin note per parameter on every rank;
// heads that do not divide stay replicated with the reason.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "models/gpt2.h"
#include "shardplan/auto_plan.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"

namespace test_auto_plan_gpt2 {

namespace {

namespace ex = shardplan::examples;
using shardplan::Plan;

std::shared_ptr<ex::GPT2Impl> build(int64_t heads, int64_t embed) {
  torch::manual_seed(3);
  ex::GPT2Config c;
  c.vocab = 32;
  c.context = 8;
  c.embed = embed;
  c.heads = heads;
  c.layers = 2;
  c.mlp = 32;
  auto m = ex::GPT2(c).ptr();
  m->to(torch::kDouble);
  return m;
}

// Probed as train_model --plan auto probes: one training loss.
Plan auto_plan_of(ex::GPT2Impl& m, int world) {
  torch::manual_seed(4);
  const auto t = torch::randint(32, {2, 9}, torch::kLong);
  const ex::Batch batch{t.narrow(1, 0, 8), t.narrow(1, 1, 8)};
  shardplan::AutoPlanOptions o;
  o.probe = [batch](torch::nn::Module& mod) { return dynamic_cast<ex::GPT2Impl&>(mod).loss(batch); };
  return shardplan::auto_plan(m, world, o);
}

std::string splits_str(const shardplan::ReportRow& row) {
  std::string s;
  for (const auto& x : row.splits)
    s += std::to_string(x.dim) + x.axis + std::to_string(x.index) + "/" + std::to_string(x.parts) + "x" +
         std::to_string(x.blocks) + " ";
  return s;
}

TEST(AutoPlanGPT2, MakesTheWrittenPlansCut) {
  const Plan hand = shardplan::load_plan(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/gpt2.yaml");
  for (int world : {2, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    auto m = build(4, 16);
    const Plan automatic = auto_plan_of(*m, world);
    EXPECT_EQ(automatic.comment.find("attn"), std::string::npos) << automatic.comment;
    for (int rank = 0; rank < world; ++rank) {
      const auto a = shardplan::check_plan(*m, automatic, world, rank);
      const auto b = shardplan::check_plan(*m, hand, world, rank);
      ASSERT_EQ(a.rows.size(), b.rows.size()) << automatic.to_yaml();
      for (size_t i = 0; i < a.rows.size(); ++i) {
        const auto &x = a.rows[i], &y = b.rows[i];
        ASSERT_EQ(x.path, y.path);
        EXPECT_EQ(x.layout, y.layout) << x.path << "\n" << automatic.to_yaml();
        EXPECT_EQ(x.local_shape, y.local_shape) << x.path << " rank " << rank;
        EXPECT_EQ(x.plugin, y.plugin) << x.path;
        EXPECT_EQ(x.note, y.note) << x.path;
        EXPECT_EQ(splits_str(x), splits_str(y)) << x.path << " rank " << rank;
      }
    }
  }
}

TEST(AutoPlanGPT2, HeadsThatDoNotDivideStayReplicatedWithTheReason) {
  auto m = build(6, 24);
  const Plan p = auto_plan_of(*m, 4);
  EXPECT_NE(p.comment.find("transformer.h.0.attn.c_proj: its attention is not split by heads"), std::string::npos)
      << p.comment;
  for (const auto& r : p.rules) EXPECT_FALSE(r.matches("transformer.h.1.attn.c_attn.weight")) << p.to_yaml();
}

}  // namespace

}  // namespace test_auto_plan_gpt2
