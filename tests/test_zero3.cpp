// ZeRO-3 over the batch axis (`data_parallel: {zero: 3}`): each
// shardplan::nn layer's parameters are all-gathered for its forward and
// backward and hold only this rank's 1/D slice in between. Exact against one
// process on the global batch (float64, 1e-10) for SGD, Adam and AdamW at
// {data: 2}, {data: 4} and {data: 2, model: 2}, with micro-batches; the
// bytes a rank keeps between steps; and bad input.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "data_parallel_fixture.h"
#include "shardplan/checkpoint.h"
#include "shardplan/clip_grad.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/mixed_precision.h"
#include "shardplan/optimizer.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/training.h"
#include "shardplan/world.h"
#include "shardplan/zero_optimizer.h"

namespace test_zero3 {

namespace {

using namespace dp_test;

const std::string kZero3 = "data_parallel: {zero: 3}\n";

std::string plan_data2() { return "version: 1\nmesh: {data: 2}\n" + kZero3 + "rules: []\n"; }

struct Opt {
  const char* name;
  bool adam, adamw;
};
const Opt kOpts[] = {{"SGD", false, false}, {"Adam", true, false}, {"AdamW", true, true}};

void expect_matches(const Task& task, const std::string& plan, int world, Loop loop, int micro) {
  for (const Opt& o : kOpts) {
    SCOPED_TRACE(std::string(o.name) + " " + plan.substr(0, 60) + " micro-batches " + std::to_string(micro));
    const RefRun ref = reference(task, o.adam, 1, o.adamw);
    DpCase c{plan};
    c.adam = o.adam;
    c.adamw = o.adamw;
    c.world = world;
    c.loop = loop;
    c.micro = micro;
    expect_same_losses(run_dp(task, c, ref), ref.losses);
  }
}

TEST(Zero3, MlpMatchesOneProcessAtEveryMeshSize) {
  const Task task = mlp_task(6, 8);
  expect_matches(task, plan_data2(), 2, Loop::optimizer, 1);
  expect_matches(task, plan_dp(kZero3), 4, Loop::finish, 1);
  expect_matches(task, plan_2d(kMlpRules, kZero3), 4, Loop::optimizer, 2);
}

TEST(Zero3, GptMatchesOneProcessAtEveryMeshSize) {
  const Task task = gpt_task(4, 8);
  expect_matches(task, plan_data2(), 2, Loop::optimizer, 2);
  expect_matches(task, plan_dp(kZero3), 4, Loop::optimizer, 1);
  expect_matches(task, plan_2d(kGptRules, kZero3), 4, Loop::finish, 1);
}

// Recomputed blocks run their layers' forwards again inside backward, where
// the gates gather again (and the regions' parameters are free when the
// forward records them).
TEST(Zero3, GptWithRecomputationMatchesOneProcess) {
  const Task task = gpt_task(4, 8);
  expect_matches(task, plan_2d(kGptRules, kZero3 + "recompute: ['blocks\\.\\d+']\n"), 4, Loop::optimizer, 2);
  expect_matches(task, plan_dp(kZero3 + "recompute: [{module: 'blocks\\.\\d+\\.attn', mode: selective}]\n"), 4,
                 Loop::optimizer, 1);
}

// Between steps a rank keeps of each layer's parameters only its 1/D slice:
// the model's parameters hold one element each, and the slices add up to 1/D of
// this rank's shard of the model (plus the padding to a multiple of D).
TEST(Zero3, BetweenStepsEachRankHoldsOnlyItsSlice) {
  const Task task = gpt_task(2, 8);
  const auto plan = shardplan::parse_plan(plan_2d(kGptRules, kZero3));
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < 4; ++r) replicas.push_back(task.model->clone());
  shardplan::run_ranks_in_threads(4, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    shardplan::Training t = shardplan::parallelize_for_training(model, plan, w);
    DataParallel& dp = *t.data_parallel;
    ASSERT_EQ(dp.zero_stage(), 3);
    int64_t shard_numel = 0;
    {
      const DataParallel::WholeParameters whole(dp);
      for (const auto& p : model.parameters()) shard_numel += p.numel();
    }
    shardplan::Optimizer opt(dp, [](std::vector<torch::Tensor> p) { return make_opt(true, p); });
    for (const auto& [gx, gy] : task.batches) {
      opt.zero_grad();
      task.loss(model, t.local_batch(gx), t.local_batch(gy)).backward();
      opt.step();
      int64_t param_bytes = 0, params = 0;
      for (const auto& p : model.parameters()) {
        param_bytes += static_cast<int64_t>(p.storage().nbytes());
        ++params;
        EXPECT_FALSE(p.grad().defined());
        EXPECT_TRUE(p.isnan().all().item<bool>());  // free: its shape over one NaN
      }
      EXPECT_LE(param_bytes, params * 8);
      int64_t slice_numel = 0, units = 0;
      for (const auto& b : opt.zero()->layout()) {
        slice_numel += b.slice.numel();
        ++units;
      }
      EXPECT_GE(slice_numel * 2, shard_numel);
      EXPECT_LE(slice_numel * 2, shard_numel + 2 * units);
    }
    // From the second step on, every gather but the first of a forward and
    // of a backward was started ahead by the gate before it.
    const auto first = dp.gather_stats();
    opt.zero_grad();
    task.loss(model, t.local_batch(task.batches[0].first), t.local_batch(task.batches[0].second)).backward();
    opt.step();
    const auto second = dp.gather_stats();
    EXPECT_GE(second.prefetched - first.prefetched, second.gathers - first.gathers - 2);
    EXPECT_GT(second.prefetched - first.prefetched, 0);
    // The window (twice the largest unit) reaches past a LayerNorm to the
    // matmul after it, and bounds what is whole at once: the unit in use, the
    // one whose gradients are still arriving, and the window.
    int64_t largest = 0;
    for (const auto& b : opt.zero()->layout())
      largest = std::max(largest, b.slice.numel() * 2 * static_cast<int64_t>(b.slice.element_size()));
    EXPECT_GE(second.most_in_flight, 2);
    EXPECT_LE(second.peak_whole_bytes, 4 * largest + 64);
    EXPECT_GT(second.peak_whole_bytes, largest);
  });
}

// A ZeRO-3 checkpoint (saved with the parameters whole, loaded back into the
// slices) resumes exactly: 2 steps, save, a fresh model zeroed, load, 2 more
// steps equal 4 steps of one process.
TEST(Zero3, CheckpointResumesExactly) {
  const Task task = gpt_task(4, 8);
  const RefRun ref = reference(task, true);
  const auto plan = shardplan::parse_plan(plan_2d(kGptRules, kZero3));
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("shardplan_zero3_ckpt_" + std::to_string(::getpid()))).string();
  std::vector<double> losses;
  std::mutex mu;
  for (int phase = 0; phase < 2; ++phase) {
    std::vector<std::shared_ptr<torch::nn::Module>> replicas;
    for (int r = 0; r < 4; ++r) replicas.push_back(task.model->clone());
    shardplan::run_ranks_in_threads(4, [&](shardplan::World& w) {
      auto& model = *replicas[w.rank()];
      if (phase == 1) {
        torch::NoGradGuard no_grad;
        for (auto& p : model.parameters()) p.zero_();
      }
      shardplan::Training t = shardplan::parallelize_for_training(model, plan, w);
      shardplan::Optimizer opt(*t.data_parallel, [](std::vector<torch::Tensor> p) { return make_opt(true, p); });
      if (phase == 1) shardplan::load_checkpoint(dir, model, t.report, w, opt.checkpoint_options());
      for (int step = 2 * phase; step < 2 * phase + 2; ++step) {
        const auto& [gx, gy] = task.batches[step];
        opt.zero_grad();
        auto loss = task.loss(model, t.local_batch(gx), t.local_batch(gy));
        loss.backward();
        opt.step();
        const double mean = t.average(loss.item<double>());
        std::lock_guard<std::mutex> lock(mu);
        if (w.rank() == 0) losses.push_back(mean);
      }
      if (phase == 0) shardplan::save_checkpoint(dir, model, t.report, w, opt.checkpoint_options());
    });
  }
  std::filesystem::remove_all(dir);
  expect_same_losses(losses, ref.losses);
}

// What each rank ends with: its losses (its own batch's) and its parameters.
struct RankRun {
  std::vector<double> losses;
  std::map<std::string, torch::Tensor> params;
};

std::vector<RankRun> train_ranks(const Task& task, const std::string& plan_yaml, int world) {
  const auto plan = shardplan::parse_plan(plan_yaml);
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(task.model->clone());
  std::vector<RankRun> out(world);
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    shardplan::Training t = shardplan::parallelize_for_training(model, plan, w);
    shardplan::Optimizer opt(*t.data_parallel, [](std::vector<torch::Tensor> p) { return make_opt(true, p); });
    RankRun& mine = out[w.rank()];
    for (const auto& [gx, gy] : task.batches) {
      opt.zero_grad();
      auto loss = task.loss(model, t.local_batch(gx), t.local_batch(gy));
      loss.backward();
      shardplan::clip_grad_norm_(opt, 0.05);  // small enough to clip every step
      opt.step();
      mine.losses.push_back(loss.item<double>());
    }
    const DataParallel::WholeParameters whole(*t.data_parallel);
    for (const auto& p : model.named_parameters()) mine.params[p.key()] = p.value().detach().clone();
  });
  return out;
}

// `ignore:` (and parameters split over the batch axis) compose with ZeRO 1-3:
// such a parameter stays whole on every rank, is not averaged, and is
// stepped with the rank's own gradient, exactly as without ZeRO.
TEST(Zero3, IgnoredAndBatchSplitParametersTrainAsWithoutZero) {
  const std::string ignore_gpt = "  ignore: ['blocks\\.0\\.fc1\\.bias', 'blocks\\.1\\.attn\\.out_proj\\.bias']\n";
  const std::string split_mlp = "rules:\n  - {match: 'fc1\\.weight', layout: [data, null]}\n";
  struct Case {
    Task task;
    std::string plan;  // with {stage}
    std::vector<std::string> local;
    int world;
  };
  const std::vector<Case> cases = {
      {gpt_task(3, 8), "version: 1\nmesh: {data: 2, model: 2}\ndata_parallel:\n  zero: {stage}\n" + ignore_gpt +
                           std::string(kGptRules),
       {"blocks.0.fc1.bias", "blocks.1.attn.out_proj.bias"}, 4},
      {mlp_task(3, 8), "version: 1\nmesh: {data: 2}\ndata_parallel: {zero: {stage}, ignore: ['fc3\\.bias']}\n" +
                           split_mlp,
       {"fc3.bias", "fc1.weight"}, 2}};
  for (const Case& c : cases) {
    auto with = [&](int stage) {
      std::string plan = c.plan;
      plan.replace(plan.find("{stage}"), 7, std::to_string(stage));
      return train_ranks(c.task, plan, c.world);
    };
    const std::vector<RankRun> plain = with(0);
    // The check means something: data ranks 0 and 1 hold different values.
    for (const std::string& name : c.local)
      EXPECT_GT((plain[0].params.at(name) - plain[c.world / 2].params.at(name)).abs().max().item<double>(), 1e-6)
          << name;
    for (int stage : {1, 2, 3}) {
      const std::vector<RankRun> zero = with(stage);
      for (int r = 0; r < c.world; ++r) {
        SCOPED_TRACE("zero " + std::to_string(stage) + " rank " + std::to_string(r));
        expect_same_losses(zero[r].losses, plain[r].losses);
        for (const auto& [name, value] : plain[r].params)
          EXPECT_LT((zero[r].params.at(name) - value).abs().max().item<double>(), 1e-10) << name;
      }
    }
  }
}

TEST(Zero3, BadInputIsOneClearLine) {
  const Task task = mlp_task(1, 8);
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < 2; ++r) replicas.push_back(task.model->clone());
  const auto plan = shardplan::parse_plan(plan_data2());
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    shardplan::Training t = shardplan::parallelize_for_training(model, plan, w);
    try {
      shardplan::Optimizer bad(*t.data_parallel, [](std::vector<torch::Tensor> p) {
        return std::make_unique<torch::optim::LBFGS>(p, torch::optim::LBFGSOptions(1));
      });
      ADD_FAILURE() << "no error";
    } catch (const shardplan::Error& e) {
      EXPECT_NE(std::string(e.what()).find("element-wise optimizers only"), std::string::npos) << e.what();
    }
    try {
      shardplan::MixedPrecision mixed;
      mixed.master_dtype = torch::kFloat;
      shardplan::Optimizer bad(*t.data_parallel, [](std::vector<torch::Tensor> p) { return make_opt(true, p); },
                               mixed);
      ADD_FAILURE() << "no error";
    } catch (const shardplan::Error& e) {
      EXPECT_NE(std::string(e.what()).find("data_parallel.zero: 3 are not supported"), std::string::npos) << e.what();
    }
    // Nothing was attached: a supported optimizer still trains.
    shardplan::Optimizer opt(*t.data_parallel, [](std::vector<torch::Tensor> p) { return make_opt(true, p); });
    task.loss(model, t.local_batch(task.batches[0].first), t.local_batch(task.batches[0].second)).backward();
    EXPECT_NO_THROW(opt.step());
  });
  torch::nn::Module plain;
  shardplan::ParallelReport none;
  none.mesh = shardplan::Mesh({{"model", 1}});
  shardplan::run_ranks_in_threads(1, [&](shardplan::World& w) {
    const auto p = shardplan::parse_plan("mesh: {model: 1}\ndata_parallel: {zero: 3}\nrules: []", "z.yaml");
    try {
      DataParallel dp(plain, none, p, w);
      ADD_FAILURE() << "no error";
    } catch (const shardplan::PlanError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("z.yaml:2:23: data_parallel.zero", 0), 0u) << e.what();
    }
  });
}

}  // namespace

}  // namespace test_zero3
