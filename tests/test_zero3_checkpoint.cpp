// Checkpoints across ZeRO stages and mesh sizes (the format is the same at
// every stage): a run saved at one stage and mesh and loaded at another
// continues exactly like the uninterrupted run of one process (float64,
// 1e-10). ZeRO-3 at {data: 2, model: 2} -> ZeRO-1 at the same mesh, ZeRO-3 at
// {data: 4} and one unsharded process; ZeRO-1 at {data: 2, model: 2} ->
// ZeRO-3 at both meshes. Ignored parameters' state as without ZeRO.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "data_parallel_fixture.h"
#include "shardplan/checkpoint.h"
#include "shardplan/optimizer.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/training.h"
#include "shardplan/world.h"

namespace test_zero3_checkpoint {

namespace {

using namespace dp_test;
namespace fs = std::filesystem;

std::string zero_2d(int stage) {
  return plan_2d(kGptRules, "data_parallel: {zero: " + std::to_string(stage) + ", bucket_mb: 0.004}\n");
}
std::string zero3_data4() { return plan_dp("data_parallel: {zero: 3}\n"); }

// One process, no plan: a plain Adam over the whole model.
std::vector<double> unsharded_stage(const Task& task, const fs::path& load, int from, int to) {
  std::vector<double> losses;
  shardplan::run_ranks_in_threads(1, [&](shardplan::World& w) {
    auto model = task.model->clone();
    {
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.zero_();
    }
    auto opt = make_opt(true, model->parameters());
    shardplan::CheckpointOptions o;
    o.optimizer = opt.get();
    shardplan::load_checkpoint(load.string(), *model, shardplan::ParallelReport{}, w, o);
    for (int s = from; s < to; ++s) {
      opt->zero_grad();
      auto loss = task.loss(*model, task.batches[s].first, task.batches[s].second);
      loss.backward();
      opt->step();
      losses.push_back(loss.item<double>());
    }
  });
  return losses;
}

// Steps [from, to) on `world` thread ranks under `plan`, from a zeroed model
// that loads `load` (unless empty), then saves `save` (unless empty). The
// global mean losses.
std::vector<double> stage(const Task& task, const std::string& plan_yaml, int world, const fs::path& load, int from,
                          int to, const fs::path& save) {
  const auto plan = shardplan::parse_plan(plan_yaml);
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(task.model->clone());
  std::vector<double> losses;
  std::mutex mu;
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    if (!load.empty()) {
      torch::NoGradGuard no_grad;
      for (auto& p : model.parameters()) p.zero_();
    }
    shardplan::Training t = shardplan::parallelize_for_training(model, plan, w);
    shardplan::Optimizer opt(*t.data_parallel, [](std::vector<torch::Tensor> p) { return make_opt(true, p); });
    if (!load.empty()) shardplan::load_checkpoint(load.string(), model, t.report, w, opt.checkpoint_options());
    for (int s = from; s < to; ++s) {
      opt.zero_grad();
      auto loss = task.loss(model, t.local_batch(task.batches[s].first), t.local_batch(task.batches[s].second));
      loss.backward();
      opt.step();
      const double mean = t.average(loss.item<double>());
      std::lock_guard<std::mutex> lock(mu);
      if (w.rank() == 0) losses.push_back(mean);
    }
    if (!save.empty()) shardplan::save_checkpoint(save.string(), model, t.report, w, opt.checkpoint_options());
  });
  return losses;
}

std::vector<double> tail(const std::vector<double>& v, int from) { return {v.begin() + from, v.end()}; }

struct Resume {
  const char* name;
  std::string plan;  // "": one unsharded process
  int world;
};

void expect_resumes(const Task& task, const RefRun& ref, const fs::path& saved, const std::vector<Resume>& loads) {
  const int at = 2, all = static_cast<int>(task.batches.size());
  for (const Resume& r : loads) {
    SCOPED_TRACE(r.name);
    const auto got = r.plan.empty() ? unsharded_stage(task, saved, at, all) : stage(task, r.plan, r.world, saved, at, all, "");
    expect_same_losses(got, tail(ref.losses, at));
  }
}

TEST(Zero3Checkpoint, Zero3SavedLoadsAtZero1Data4AndUnsharded) {
  const Task task = gpt_task(4, 8);
  const RefRun ref = reference(task, true);
  const fs::path dir = fs::temp_directory_path() / ("shardplan_zero3_to_any_" + std::to_string(::getpid()));
  expect_same_losses(stage(task, zero_2d(3), 4, "", 0, 2, dir), {ref.losses.begin(), ref.losses.begin() + 2});
  expect_resumes(task, ref, dir,
                 {{"ZeRO-1 {data: 2, model: 2}", zero_2d(1), 4},
                  {"ZeRO-3 {data: 4}", zero3_data4(), 4},
                  {"ZeRO-3 {data: 2, model: 2}", zero_2d(3), 4},
                  {"unsharded", "", 1}});
  fs::remove_all(dir);
}

TEST(Zero3Checkpoint, Zero1SavedLoadsAtZero3) {
  const Task task = gpt_task(4, 8);
  const RefRun ref = reference(task, true);
  const fs::path dir = fs::temp_directory_path() / ("shardplan_zero1_to_zero3_" + std::to_string(::getpid()));
  expect_same_losses(stage(task, zero_2d(1), 4, "", 0, 2, dir), {ref.losses.begin(), ref.losses.begin() + 2});
  expect_resumes(task, ref, dir,
                 {{"ZeRO-3 {data: 2, model: 2}", zero_2d(3), 4}, {"ZeRO-3 {data: 4}", zero3_data4(), 4}});
  fs::remove_all(dir);
}

// An ignored parameter (whole on every rank, stepped locally) has its
// optimizer state saved and loaded as without ZeRO: the same checkpoint
// continues the same, in one process and back at ZeRO-3.
TEST(Zero3Checkpoint, IgnoredParametersSaveAndLoadAsWithoutZero) {
  const Task task = gpt_task(4, 8);
  auto plan = [](int stage) {
    return plan_2d(kGptRules, "data_parallel: {zero: " + std::to_string(stage) +
                                  ", ignore: ['blocks\\.0\\.fc1\\.bias', 'blocks\\.1\\.attn\\.out_proj\\.bias']}\n");
  };
  const std::string tag = std::to_string(::getpid());
  const fs::path plain = fs::temp_directory_path() / ("shardplan_ignore_zero0_" + tag);
  const fs::path zero3 = fs::temp_directory_path() / ("shardplan_ignore_zero3_" + tag);
  expect_same_losses(stage(task, plan(3), 4, "", 0, 2, zero3), stage(task, plan(0), 4, "", 0, 2, plain));
  expect_same_losses(unsharded_stage(task, zero3, 2, 4), unsharded_stage(task, plain, 2, 4));
  expect_same_losses(stage(task, plan(3), 4, zero3, 2, 4, ""), stage(task, plan(0), 4, plain, 2, 4, ""));
  fs::remove_all(plain);
  fs::remove_all(zero3);
}

}  // namespace

}  // namespace test_zero3_checkpoint
