// Dropout under a pipeline. One process's masks cannot be reproduced: a
// micro-batch draws a mask of its own shape, and tensor parallelism draws
// sharded activations' masks from per-rank streams (shardplan/random.h).
// What a pipeline owes instead: each stage draws from streams of its own
// (seed + 100 x stage, Megatron's), so two stages' layers never share masks;
// the draws do not depend on the schedule (forwards run in micro-batch order
// under GPipe and 1F1B alike), so runs are reproducible; and the model ranks
// of a stage agree on the replicated masks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "shardplan/nn/dropout.h"
#include "shardplan/parallelize.h"
#include "shardplan/pipeline.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace test_pipeline_run_dropout {

namespace {

using namespace shardplan;
namespace ex = shardplan::examples;

// Linear (identity), dropout, Linear (identity), dropout: stage 0 runs the
// first pair, stage 1 the second. The output's kept fraction is (1 - p)^2
// when the stages draw independent masks, 1 - p when they draw the same.
TEST(PipelineDropout, StagesDrawFromStreamsOfTheirOwn) {
  auto identity = [] {
    torch::nn::Linear l(torch::nn::LinearOptions(256, 256).bias(false));
    torch::NoGradGuard no_grad;
    l->weight.copy_(torch::eye(256));
    return l;
  };
  const Plan plan = parse_plan("version: 1\nmesh: {pipe: 2}\npipeline: {schedule: gpipe, micro_batches: 1, stages: "
                               "[['0', '1'], ['2', '3']]}\nrules: []\n",
                               "p.yaml");
  double kept = -1;
  run_ranks_in_threads(2, [&](World& world) {
    torch::manual_seed(3);
    torch::nn::Sequential seq(identity(), nn::Dropout(0.5), identity(), nn::Dropout(0.5));
    parallelize(*seq, plan, world);  // makes the rank's RNG tracker current
    SequentialPipeline pieces(seq);
    Pipeline pipe(*seq, pieces, plan, world);
    pipe.step(torch::ones({4, 256}), torch::zeros({4, 256}), [&](const at::Tensor& out, const at::Tensor&) {
      kept = (out != 0).to(torch::kDouble).mean().item<double>();
      return out.sum();
    });
  });
  EXPECT_NEAR(kept, 0.25, 0.05);  // 0.5 with one stream for both stages
}

ex::GPT dropout_gpt() {
  ex::GPTConfig c;
  c.vocab = 32, c.context = 6, c.embed = 16, c.heads = 2, c.layers = 2, c.mlp = 24, c.dropout = 0.2;
  torch::manual_seed(5);
  ex::GPT gpt(c);
  gpt->to(torch::kDouble);
  return gpt;
}

// plans/gpt.yaml's rules at {pipe: 2, model: 2}: per rank, the losses and
// parameters after 3 Adam steps.
struct DropoutRun {
  std::vector<double> losses;
  std::vector<std::map<std::string, at::Tensor>> params;  // per rank
};

DropoutRun run_gpt(const ex::GPT& gpt, const std::string& schedule) {
  std::ifstream in(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/gpt.yaml");
  std::stringstream text;
  text << in.rdbuf();
  std::string yaml = text.str();
  const std::string old = "mesh: {model: auto}";
  yaml.replace(yaml.find(old), old.size(),
               "mesh: {pipe: 2, model: 2}\npipeline: {schedule: " + schedule + ", micro_batches: 2}");
  const Plan plan = parse_plan(yaml, "gpt_pipe.yaml");
  torch::manual_seed(7);
  std::vector<std::pair<at::Tensor, at::Tensor>> batches;
  for (int i = 0; i < 3; ++i) batches.emplace_back(torch::randint(32, {4, 6}), torch::randint(32, {4, 6}));
  DropoutRun run;
  run.params.resize(4);
  std::mutex mu;
  run_ranks_in_threads(4, [&](World& world) {
    auto model = std::dynamic_pointer_cast<ex::GPTImpl>(gpt->clone());
    torch::manual_seed(11);  // the tracker's seed, alike on every rank
    const ParallelReport report = parallelize(*model, plan, world);
    Pipeline pipe(*model, *model, plan, world, &report);
    torch::optim::Adam opt(pipe.parameters(), torch::optim::AdamOptions(1e-2));
    std::vector<double> losses;
    for (const auto& [x, y] : batches) {
      opt.zero_grad();
      losses.push_back(pipe.step(x, y, [&](const at::Tensor& out, const at::Tensor& t) {
        return model->output_loss(out, t);
      }));
      opt.step();
    }
    std::lock_guard<std::mutex> lock(mu);
    if (world.rank() == 0) run.losses = losses;
    for (const auto& [name, p] : pipe.named_parameters()) run.params[world.rank()][name] = p.detach().clone();
  });
  return run;
}

}  // namespace

TEST(PipelineDropout, GptIsReproducibleAcrossSchedulesAndKeepsReplicas) {
  const ex::GPT gpt = dropout_gpt();
  const DropoutRun a = run_gpt(gpt, "gpipe"), b = run_gpt(gpt, "1f1b");
  ASSERT_EQ(a.losses.size(), 3u);
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_NEAR(a.losses[i], b.losses[i], 1e-10) << "step " << i;
  for (int r = 0; r < 4; ++r)
    for (const auto& [name, t] : a.params[r])
      EXPECT_LT((t - b.params[r].at(name)).abs().max().item<double>(), 1e-10) << "rank " << r << " " << name;
  // Ranks 0 and 1 (2 and 3) are the model ranks of one stage: a replicated
  // parameter (the LayerNorms) stays equal, so their masks over replicated
  // activations agreed.
  for (int r : {0, 2})
    for (const auto& [name, t] : a.params[r])
      if (name.find("ln") != std::string::npos)
        EXPECT_TRUE(torch::equal(t, a.params[r + 1].at(name))) << "rank " << r << " " << name;
  // Dropout is on: without it the losses differ.
  ex::GPT plain = dropout_gpt();
  for (auto& block : *plain->blocks) block->as<ex::GPTBlockImpl>()->attn->options.dropout(0.0);
  EXPECT_GT(std::abs(run_gpt(plain, "gpipe").losses[0] - a.losses[0]), 1e-6);
}

}  // namespace test_pipeline_run_dropout
