// check_replicas over a pipelined model ({data: 2, pipe: 2, model: 2}): each
// rank compares its stage's parameters over the data and model axes, never
// over the pipe axis, whose ranks hold other stages. Trained replicas pass;
// one replicated parameter nudged on one rank makes every rank throw, the
// finder naming the parameter and the axis.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/pipeline.h"
#include "shardplan/plan.h"
#include "shardplan/replicas.h"
#include "shardplan/world.h"

namespace test_pipeline_replicas {

using namespace shardplan;
namespace ex = shardplan::examples;

std::shared_ptr<ex::GPTImpl> small_gpt() {
  ex::GPTConfig c;
  c.vocab = 32, c.context = 6, c.embed = 16, c.heads = 2, c.layers = 2, c.mlp = 24;
  torch::manual_seed(5);
  auto m = ex::GPT(c).ptr();
  m->to(torch::kDouble);
  return m;
}

// `nudge`: the rank that changes one of its stage's LayerNorm weights
// (replicated over the model and data axes) after the step; -1: none.
// Returns each rank's error, empty where it passed.
std::vector<std::string> check_after_a_step(int nudge) {
  const Plan plan = load_plan(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/gpt_pipe_3d.yaml");
  const auto gpt = small_gpt();
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  for (int r = 0; r < 8; ++r) models.push_back(gpt->clone());
  std::vector<std::string> errors(8);
  std::mutex mu;
  torch::manual_seed(7);
  const at::Tensor x = torch::randint(32, {8, 6}), y = torch::randint(32, {8, 6});
  run_ranks_in_threads(8, [&](World& world) {
    auto& model = dynamic_cast<ex::GPTImpl&>(*models[world.rank()]);
    const ParallelReport report = parallelize(model, plan, world);
    Pipeline pipe(model, model, plan, world, &report);
    torch::optim::Adam opt(pipe.parameters(), torch::optim::AdamOptions(1e-2));
    pipe.step(x, y, [&model](const at::Tensor& out, const at::Tensor& t) { return model.output_loss(out, t); });
    if (DataParallel* dp = pipe.data_parallel()) dp->finish();
    opt.step();
    if (world.rank() == nudge)
      for (auto& [name, p] : pipe.named_parameters())
        if (name.find("ln") != std::string::npos && name.find("weight") != std::string::npos) {
          torch::NoGradGuard no_grad;
          p.add_(1e-12);
          break;
        }
    try {
      check_replicas(pipe, report, world);
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors[world.rank()] = e.what();
    }
  });
  return errors;
}

TEST(PipelineReplicas, TrainedStagesPassOverTheDataAndModelAxes) {
  for (const auto& e : check_after_a_step(-1)) EXPECT_EQ(e, "");
}

TEST(PipelineReplicas, ADriftOnOneRankStopsEveryRank) {
  const auto errors = check_after_a_step(3);
  for (int r = 0; r < 8; ++r) EXPECT_NE(errors[r], "") << "rank " << r << " went on";
  bool named = false;
  for (const auto& e : errors) named |= e.find("ln") != std::string::npos && e.find("clip_grad_norm_") != std::string::npos;
  EXPECT_TRUE(named) << errors[3];
}

}  // namespace test_pipeline_replicas
