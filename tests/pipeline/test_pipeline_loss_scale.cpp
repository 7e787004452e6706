// A loss scaler over a pipeline (what the trainers' --loss-scale dynamic
// does): shardplan::Optimizer over a DataParallel of the stage's parameters.
// An inf in one stage's gradient makes every rank of every stage skip the
// step and halve the scale alike; stage 0, whose gradients are finite, does
// not move either.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "shardplan/data_parallel.h"
#include "shardplan/mixed_precision.h"
#include "shardplan/optimizer.h"
#include "shardplan/parallelize.h"
#include "shardplan/pipeline.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace test_pipeline_loss_scale {

using namespace shardplan;

TEST(PipelineLossScale, AnInfInOneStageSkipsTheStepOnEveryStage) {
  const Plan plan = parse_plan("version: 1\nmesh: {pipe: 2}\npipeline: {schedule: 1f1b, micro_batches: 2}\nrules: []\n",
                               "p.yaml");
  torch::manual_seed(4);
  const at::Tensor x = torch::randn({4, 6}), y = torch::randn({4, 3});
  std::vector<std::vector<bool>> skipped(2);
  std::vector<std::vector<double>> scales(2);
  std::vector<bool> moved(2);
  run_ranks_in_threads(2, [&](World& world) {
    torch::manual_seed(5);
    torch::nn::Sequential seq(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
    const ParallelReport report = parallelize(*seq, plan, world);
    SequentialPipeline pieces(seq);
    Pipeline pipe(*seq, pieces, plan, world, &report);
    DataParallel dp(pipe.named_parameters(), report, plan, world);
    MixedPrecision mixed;
    mixed.loss_scaler = LossScalerOptions{};
    Optimizer opt(dp, [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1)); }, mixed);
    const int rank = world.rank();
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      {
        DataParallel::NoSync accumulate(dp);
        pipe.step(x, y, [&](const at::Tensor& out, const at::Tensor& t) { return opt.scale_loss(torch::mse_loss(out, t)); });
      }
      dp.finish();
      // Stage 1 only: its last Linear's weight.
      if (step == 0 && pipe.stage() == 1) pipe.parameters()[0].grad()[0][0] = std::numeric_limits<float>::infinity();
      const at::Tensor before = pipe.parameters()[0].detach().clone();
      scales[rank].push_back(opt.loss_scaler()->scale());
      opt.step();
      skipped[rank].push_back(opt.last_step_skipped());
      if (step == 0) moved[rank] = !torch::equal(before, pipe.parameters()[0]);
    }
    scales[rank].push_back(opt.loss_scaler()->scale());
  });
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(skipped[r], (std::vector<bool>{true, false}));
    EXPECT_FALSE(moved[r]);
    EXPECT_EQ(scales[r], scales[0]);
    EXPECT_LT(scales[r][1], scales[r][0]);  // backed off after the inf
  }
}

}  // namespace test_pipeline_loss_scale
