// The training loop over data parallelism (shardplan/optimizer.h,
// shardplan/training.h): PyTorch DDP's loop with no finish(), round 2's loop
// with finish() forgotten, several backwards per step, micro-batches all
// under NoSync, each against one process on the global batch (1e-10); and
// the plan keys and bad input of data parallelism.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "data_parallel_fixture.h"
#include "models/gpt.h"
#include "models/model.h"
#include "shardplan/checkpoint.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/nn/linear.h"
#include "shardplan/optimizer.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/training.h"
#include "shardplan/world.h"
#include "shardplan/zero_optimizer.h"

namespace test_data_parallel_loop {

namespace {

namespace ex = shardplan::examples;
using namespace dp_test;

// ------------------------------------------------------------ the loop

// Each plan with `loop`, in one micro-batch and in two, against one process.
void expect_loop_matches(const Task& task, const std::vector<std::string>& plans, Loop loop) {
  const RefRun ref = reference(task, true);
  for (const std::string& plan : plans)
    for (int micro : {1, 2}) {
      SCOPED_TRACE(plan.substr(0, 60) + " micro-batches " + std::to_string(micro));
      DpCase c{plan};
      c.loop = loop;
      c.micro = micro;
      expect_same_losses(run_dp(task, c, ref), ref.losses);
    }
}

const std::string kZero = "data_parallel: {zero: true, bucket_mb: 0.001}\n";

// PyTorch DDP's loop (README, "Data parallelism"): parallelize_for_training,
// shardplan::Optimizer, no finish(); plain and ZeRO-1 alike.
TEST(DataParallel, DdpStyleLoopMatchesOneProcess) {
  expect_loop_matches(gpt_task(10, 8), {plan_2d(kGptRules), plan_2d(kGptRules, kZero), plan_dp(), plan_dp(kZero)},
                      Loop::optimizer);
  expect_loop_matches(mlp_task(10, 8), {plan_2d(kMlpRules), plan_2d(kMlpRules, kZero), plan_dp(), plan_dp(kZero)},
                      Loop::optimizer);
}

// Round 2's loop without its finish(): step 1 used to step on this rank's
// own gradients, silently. The end of backward now averages them.
TEST(DataParallel, ForgottenFinishIsDoneByTheEndOfBackward) {
  expect_loop_matches(mlp_task(10, 8),
                      {plan_2d(kMlpRules), plan_dp(kZero), plan_dp("data_parallel: {overlap: false}\n")},
                      Loop::forgotten_finish);
}

// Two backwards before one step, neither under NoSync: each is a reduction
// round of its own, and the second adds to the first's averages as one
// process adds to .grad (ZeRO: to the first's reduced slices).
TEST(DataParallel, SeveralBackwardsBeforeAStepAccumulateAsInOneProcess) {
  const Task task = mlp_task(10, 8);
  const RefRun ref = reference(task, true);
  for (const std::string& plan : {plan_2d(kMlpRules), plan_dp(kZero)})
    for (Loop loop : {Loop::finish, Loop::optimizer}) {
      SCOPED_TRACE(plan.substr(0, 60));
      DpCase c{plan};
      c.loop = loop;
      c.micro = 2;
      c.sync = DpCase::every_syncs;
      expect_same_losses(run_dp(task, c, ref), ref.losses);
    }
}

// Every micro-batch under NoSync: no backward ends a round, so the
// optimizer's step() must (a torch optimizer would step on local gradients).
TEST(DataParallel, TheOptimizerCompletesARoundOfNoSyncBackwards) {
  const Task task = mlp_task(10, 8);
  const RefRun ref = reference(task, true);
  for (const std::string& plan : {plan_2d(kMlpRules), plan_dp("data_parallel: {zero: true}\n")}) {
    SCOPED_TRACE(plan.substr(0, 60));
    DpCase c{plan};
    c.loop = Loop::optimizer;
    c.micro = 2;
    c.sync = DpCase::none_syncs;
    expect_same_losses(run_dp(task, c, ref), ref.losses);
  }
}

TEST(DataParallel, StepInsideNoSyncIsAnErrorAndAPlanWithoutABatchAxisTrainsAlone) {
  const Task task = mlp_task(1, 8);
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < 2; ++r) replicas.push_back(task.model->clone());
  for (const char* yaml : {"mesh: {data: 2}\nrules: []\n", "mesh: {data: 2}\ndata_parallel: {zero: true}\nrules: []\n"})
    shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
      auto& model = *replicas[w.rank()];
      auto t = shardplan::parallelize_for_training(model, shardplan::parse_plan(yaml), w);
      shardplan::Optimizer opt(*t.data_parallel, [](std::vector<torch::Tensor> p) { return make_opt(false, p); });
      EXPECT_EQ(opt.zero() != nullptr, t.data_parallel->zero());
      const auto ckpt = opt.checkpoint_options();  // one field set, the right one
      EXPECT_EQ(ckpt.zero, opt.zero());
      EXPECT_EQ(ckpt.optimizer, opt.zero() ? nullptr : &opt.inner());
      std::vector<torch::Tensor> before;
      for (const auto& p : model.parameters()) before.push_back(p.detach().clone());
      {
        DataParallel::NoSync no_sync(*t.data_parallel);
        task.loss(model, t.local_batch(task.batches[0].first), t.local_batch(task.batches[0].second)).backward();
        try {
          opt.step();
          ADD_FAILURE() << "no error";
        } catch (const shardplan::Error& e) {
          EXPECT_NE(std::string(e.what()).find("finish() inside NoSync"), std::string::npos) << e.what();
        }
      }
      size_t i = 0;
      for (const auto& p : model.parameters()) EXPECT_TRUE(torch::equal(p, before[i++])) << "stepped inside NoSync";
      opt.step();  // after the scope: averaged, then stepped
      i = 0;
      bool moved = false;
      for (const auto& p : model.parameters()) moved |= !torch::equal(p, before[i++]);
      EXPECT_TRUE(moved);
    });
  // {model: 2} has no batch axis: a DataParallel of size 1, the loop unchanged.
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
    auto model = task.model->clone();
    auto t = shardplan::parallelize_for_training(*model, shardplan::parse_plan("mesh: {model: 2}\nrules: []\n"), w);
    EXPECT_EQ(t.data_parallel->size(), 1);
    EXPECT_EQ(t.local_batch(task.batches[0].first).size(0), 8);
  });
}

// ------------------------------------------------------------ plan keys and bad input

// `zero` is a ZeRO stage; `true` and `false` stay 1 and 0, and the canonical
// form writes the stage.
TEST(DataParallel, ZeroStagesParseAndRoundTrip) {
  const std::vector<std::pair<std::string, int>> cases = {{"0", 0}, {"1", 1}, {"2", 2}, {"3", 3},
                                                          {"true", 1}, {"false", 0}};
  for (const auto& [value, stage] : cases) {
    const auto p = shardplan::parse_plan("mesh: {data: 2}\ndata_parallel: {zero: " + value + "}\nrules: []\n");
    EXPECT_EQ(p.data_parallel.zero, stage) << value;
    const std::string yaml = p.to_yaml();
    EXPECT_EQ(yaml.find("zero: " + std::to_string(stage)) != std::string::npos, stage != 0) << yaml;
    EXPECT_EQ(shardplan::parse_plan(yaml).data_parallel.zero, stage) << yaml;
    EXPECT_EQ(shardplan::parse_plan(yaml).to_yaml(), yaml);
  }
  for (const std::string bad : {"4", "-1", "2.0", "two", "[2]", "{}"}) {
    try {
      shardplan::parse_plan("mesh: {data: 2}\ndata_parallel: {zero: " + bad + "}\nrules: []\n", "z.yaml");
      ADD_FAILURE() << bad << ": no error";
    } catch (const shardplan::PlanError& e) {
      EXPECT_NE(std::string(e.what()).find("z.yaml:2:23: data_parallel.zero must be a ZeRO stage 0, 1, 2 or 3"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(DataParallel, PlanKeysParseAndRoundTrip) {
  auto p = shardplan::parse_plan(
      "mesh: {replica: 2, model: auto}\nbatch_axis: replica\n"
      "data_parallel: {ignore: ['a\\.b', 'c'], bucket_mb: 4, first_bucket_mb: 0.5, overlap: false, zero: true}\n"
      "rules: []\n");
  EXPECT_EQ(p.batch_axis(), "replica");
  EXPECT_EQ(p.data_parallel.ignore.size(), 2u);
  EXPECT_EQ(p.data_parallel.bucket_bytes, 4 * 1024 * 1024);
  EXPECT_EQ(p.data_parallel.first_bucket_bytes, 512 * 1024);
  EXPECT_NE(p.to_yaml().find("first_bucket_mb: 0.5"), std::string::npos);
  EXPECT_FALSE(p.data_parallel.overlap);
  EXPECT_TRUE(p.data_parallel.zero);
  auto q = shardplan::parse_plan(p.to_yaml());
  EXPECT_EQ(q.to_yaml(), p.to_yaml());
  EXPECT_EQ(q.data_parallel.ignore[1].pattern, "c");
  // Defaults: an axis called data, else batch, else none; a plain plan's
  // canonical form does not change.
  EXPECT_EQ(shardplan::parse_plan("mesh: {data: 2, model: 2}\nrules: []").batch_axis(), "data");
  EXPECT_EQ(shardplan::parse_plan("mesh: {batch: 2, model: 2}\nrules: []").batch_axis(), "batch");
  EXPECT_EQ(shardplan::parse_plan("mesh: {model: 2}\nrules: []").batch_axis(), "");
  EXPECT_EQ(shardplan::parse_plan("mesh: {model: 2}\nrules: []").to_yaml().find("data_parallel"), std::string::npos);
}

void expect_plan_error(const std::string& yaml, const std::string& message) {
  try {
    shardplan::parse_plan(yaml, "p.yaml");
    FAIL() << "no error for " << yaml;
  } catch (const shardplan::PlanError& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(DataParallel, BadPlanKeysAreErrorsAtTheirLine) {
  expect_plan_error("mesh: {data: 2, model: 2}\nbatch_axis: dta\nrules: []",
                    "p.yaml:2:13: batch_axis 'dta' is not a mesh axis; mesh axes are: data, model");
  expect_plan_error("mesh: {data: 2}\ndata_parallel: {zro: true}\nrules: []",
                    "p.yaml:2:17: unknown key 'zro' in data_parallel (expected ignore, bucket_mb, first_bucket_mb, overlap, zero, reduce_dtype)");
  expect_plan_error("mesh: {data: 2}\ndata_parallel: {bucket_mb: 0}\nrules: []",
                    "p.yaml:2:28: data_parallel.bucket_mb must be a positive number of MiB, got '0'");
  expect_plan_error("mesh: {data: 2}\ndata_parallel: {first_bucket_mb: -1}\nrules: []",
                    "p.yaml:2:34: data_parallel.first_bucket_mb must be a positive number of MiB, got '-1'");
  expect_plan_error("mesh: {data: 2}\ndata_parallel: {zero: maybe}\nrules: []",
                    "p.yaml:2:23: data_parallel.zero must be a ZeRO stage 0, 1, 2 or 3 (true is 1, false 0), got 'maybe'");
  try {
    shardplan::parse_plan("mesh: {data: 2}\ndata_parallel: {ignore: ['fc(']}\nrules: []", "p.yaml");
    FAIL();
  } catch (const shardplan::PlanError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("p.yaml:2:26: invalid regex 'fc('", 0), 0u) << e.what();
  }
}

TEST(DataParallel, BadInputIsAClearErrorThatChangesNothing) {
  const Task task = mlp_task(1, 6);
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < 4; ++r) replicas.push_back(task.model->clone());
  const auto plan = shardplan::parse_plan(plan_dp("data_parallel: {zero: true}\n"));
  shardplan::run_ranks_in_threads(4, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    auto report = shardplan::parallelize(model, plan, w);
    DataParallel dp(model, report, plan, w);
    try {
      dp.local_batch(task.batches[0].first);  // 6 rows over 4 ranks
      ADD_FAILURE() << "no error";
    } catch (const shardplan::Error& e) {
      EXPECT_STREQ(e.what(),
                   "data parallel: the global batch of 6 samples does not divide over the 4 ranks of batch axis "
                   "'data'; use a batch that is a multiple of 4");
    }
    std::vector<torch::Tensor> before;
    for (const auto& p : model.parameters()) before.push_back(p.detach().clone());
    try {
      shardplan::ZeroOptimizer bad(dp, [](std::vector<torch::Tensor> p) {
        return std::make_unique<torch::optim::LBFGS>(p, torch::optim::LBFGSOptions(1));
      });
      ADD_FAILURE() << "no error";
    } catch (const shardplan::Error& e) {
      EXPECT_NE(std::string(e.what()).find("ZeroOptimizer supports element-wise optimizers only"), std::string::npos);
    }
    size_t i = 0;
    for (const auto& p : model.parameters()) EXPECT_TRUE(torch::equal(p, before[i++]));
    // Nothing was attached: a supported optimizer is still accepted.
    EXPECT_NO_THROW(shardplan::ZeroOptimizer(dp, [](std::vector<torch::Tensor> p) { return make_opt(true, p); }));
  });
  // A batch axis the applied mesh lacks; ZeRO without any batch axis.
  torch::nn::Module plain;
  shardplan::ParallelReport none;
  none.mesh = shardplan::Mesh({{"model", 1}});
  shardplan::run_ranks_in_threads(1, [&](shardplan::World& w) {
    const auto p = shardplan::parse_plan("mesh: {model: 1}\ndata_parallel: {zero: true}\nrules: []", "z.yaml");
    try {
      DataParallel dp(plain, none, p, w);
      ADD_FAILURE() << "no error";
    } catch (const shardplan::PlanError& e) {
      EXPECT_NE(std::string(e.what()).find("z.yaml:2:23: data_parallel.zero shards the optimizer over the batch axis"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace

}  // namespace test_data_parallel_loop
