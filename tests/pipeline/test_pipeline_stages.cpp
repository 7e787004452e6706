// Cutting a model into stages: explicit patterns (every piece in exactly one
// stage, in order; errors name the module and the pattern's file:line:col)
// and auto (balanced by parameter count); a Sequential's children as pieces.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "shardplan/error.h"
#include "shardplan/pipeline.h"
#include "shardplan/plan.h"

namespace test_pipeline_stages {

namespace {

using namespace shardplan;
using Pieces = std::vector<std::vector<std::string>>;

// The example GPT's pieces with 4 blocks.
const Pieces kGpt = {{"tok_emb", "pos_emb"}, {"blocks.0"}, {"blocks.1"}, {"blocks.2"}, {"blocks.3"}, {"ln_f", "head"}};

PipelineSpec spec_of(const std::string& stages, int pipe = 2) {
  return parse_plan("version: 1\nmesh: {pipe: " + std::to_string(pipe) + "}\npipeline: {micro_batches: 4, stages: " +
                        stages + "}\nrules: []\n",
                    "p.yaml")
      .pipeline;
}

std::string error_of(const Pieces& pieces, const std::string& stages, int pipe = 2) {
  try {
    assign_stages(pieces, std::vector<int64_t>(pieces.size(), 1), spec_of(stages, pipe), pipe);
  } catch (const PlanError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(PipelineStages, ExplicitPatternsGiveContiguousRuns) {
  const StageRanges r = assign_stages(kGpt, std::vector<int64_t>(6, 1),
                                      spec_of("[['tok_emb|pos_emb', 'blocks\\.[01]'], ['blocks\\.[23]', 'ln_f', 'head']]"), 2);
  EXPECT_EQ(r, (StageRanges{{0, 3}, {3, 6}}));
  const StageRanges four = assign_stages(kGpt, std::vector<int64_t>(6, 1),
                                         spec_of("[['.*_emb'], ['blocks\\.[0-2]'], ['blocks\\.3'], ['ln_f|head']]", 4), 4);
  EXPECT_EQ(four, (StageRanges{{0, 1}, {1, 4}, {4, 5}, {5, 6}}));
}

TEST(PipelineStages, BadPatternsNameTheModuleAndThePattern) {
  // stages: starts at column 43 of line 3.
  EXPECT_EQ(error_of(kGpt, "[['tok_emb|pos_emb', 'blocks\\.[01]'], ['blocks\\.[23]', 'ln_f']]"),
            "p.yaml:3:38: module 'head' is in no stage of pipeline.stages");
  EXPECT_EQ(error_of(kGpt, "[['.*_emb', 'blocks\\.[0-2]'], ['blocks\\.[23]', 'ln_f|head']]"),
            "p.yaml:3:69: module 'blocks.2' is matched by stage 0's 'blocks\\.[0-2]' and by stage 1's 'blocks\\.[23]'; "
            "each module belongs to one stage");
  EXPECT_EQ(error_of(kGpt, "[['.*_emb', 'blocks\\.[02]'], ['blocks\\.[13]', 'ln_f|head']]"),
            "p.yaml:3:50: module 'blocks.2' is in stage 0, after 'blocks.1' in stage 1: stages must follow the "
            "model's order");
  EXPECT_EQ(error_of(kGpt, "[['tok_emb', 'blocks\\.\\d'], ['pos_emb', 'ln_f|head']]"),
            "p.yaml:3:67: module 'pos_emb' is in stage 1 but 'tok_emb' in stage 0: they are one piece of the model, "
            "which cannot be cut between them");
  EXPECT_EQ(error_of(kGpt, "[['.*_emb', 'blocks\\.\\d', 'blocks\\.9'], ['ln_f|head']]"),
            "p.yaml:3:64: pattern 'blocks\\.9' of stage 0 matches no module of the model's pieces");
  EXPECT_EQ(error_of({{"a"}}, "auto"), "p.yaml:3:11: the model has 1 pieces, fewer than the 2 pipeline stages");
}

TEST(PipelineStages, AutoBalancesParameterCounts) {
  const PipelineSpec automatic = spec_of("auto");
  // Embeddings 40, four blocks of 10, head 40: the best largest stage of 2 is 60.
  const std::vector<int64_t> gpt = {40, 10, 10, 10, 10, 40};
  EXPECT_EQ(assign_stages(kGpt, gpt, automatic, 2), (StageRanges{{0, 3}, {3, 6}}));
  // Of 4: [40] [10 10 10] [10] [40], largest 40 (ties keep earlier cuts).
  const StageRanges four = assign_stages(kGpt, gpt, automatic, 4);
  int64_t largest = 0;
  for (const auto& [b, e] : four) {
    ASSERT_LT(b, e);
    int64_t n = 0;
    for (size_t i = b; i < e; ++i) n += gpt[i];
    largest = std::max(largest, n);
  }
  EXPECT_EQ(largest, 40);
  EXPECT_EQ(four.front().first, 0u);
  EXPECT_EQ(four.back().second, 6u);
  for (size_t s = 1; s < four.size(); ++s) EXPECT_EQ(four[s].first, four[s - 1].second);
  // Every stage gets a piece even when pieces have no parameters.
  EXPECT_EQ(assign_stages(Pieces{{"a"}, {"b"}, {"c"}}, {0, 0, 0}, automatic, 3),
            (StageRanges{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_EQ(assign_stages(Pieces{{"a"}, {"b"}, {"c"}}, {1, 100, 1}, automatic, 2), (StageRanges{{0, 1}, {1, 3}}));
}

TEST(PipelineStages, SequentialChildrenArePieces) {
  torch::nn::Sequential seq(torch::nn::Linear(3, 4), torch::nn::Tanh(), torch::nn::Linear(4, 2));
  SequentialPipeline pipe(seq);
  EXPECT_EQ(pipe.pieces(), (Pieces{{"0"}, {"1"}, {"2"}}));
  const at::Tensor x = torch::randn({5, 3});
  at::Tensor y = x;
  for (size_t i = 0; i < 3; ++i) y = pipe.forward_piece(i, y);
  EXPECT_TRUE(torch::equal(y, seq->forward(x)));
  EXPECT_THROW(pipe.forward_piece(3, x), Error);
}

}  // namespace test_pipeline_stages
