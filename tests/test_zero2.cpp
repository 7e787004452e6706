// ZeRO-2 (`data_parallel: {zero: 2}`): gradients reduce-scattered bucket by
// bucket, no whole gradient kept past its bucket's reduction. The example
// GPT and an MLP trained in float64 on thread ranks at {data: 2},
// {data: 4} and {data: 2, model: 2} end with the parameters of one process
// on the global batch (1e-10) with SGD, Adam and AdamW, with micro-batches
// (NoSync keeps whole gradients, as torch FSDP's no_sync) and several
// backwards per step; after backward a rank holds only its gradient slices.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "data_parallel_fixture.h"
#include "shardplan/data_parallel.h"
#include "shardplan/optimizer.h"
#include "shardplan/plan.h"
#include "shardplan/state_bytes.h"
#include "shardplan/training.h"
#include "shardplan/world.h"

namespace test_zero2 {

using namespace dp_test;

// Tiny buckets: several per model, slices that cut parameters, padding.
const std::string kZero2 = "data_parallel: {zero: 2, bucket_mb: 0.001}\n";

std::string plan_data2(const std::string& extra) { return "version: 1\nmesh: {data: 2}\n" + extra + "rules: []\n"; }

struct Opt {
  const char* name;
  bool adam, adamw;
};
const Opt kOpts[] = {{"sgd", false, false}, {"adam", true, false}, {"adamw", true, true}};

TEST(ZeroTwo, MatchesOneProcessOnTheGlobalBatch) {
  for (const Task& task : {gpt_task(12, 8), mlp_task(12, 8)})
    for (const Opt& o : kOpts) {
      const bool gpt = task.batches[0].first.scalar_type() == torch::kLong;
      const RefRun ref = reference(task, o.adam, 1, o.adamw);
      DpCase two_d{plan_2d(gpt ? kGptRules : kMlpRules, kZero2), o.adam};
      DpCase data4{plan_dp(kZero2), o.adam};
      DpCase data2{plan_data2(kZero2), o.adam, 1, 2};
      for (DpCase c : {two_d, data4, data2}) {
        c.adamw = o.adamw;
        SCOPED_TRACE(c.plan.substr(0, 40) + " " + o.name);
        expect_same_losses(run_dp(task, c, ref), ref.losses);
      }
    }
}

// NoSync micro-batches, a backward per micro-batch each reduced (the slices
// accumulate), and shardplan::Optimizer's loop without finish().
TEST(ZeroTwo, MicroBatchesMatchOneProcess) {
  for (const Task& task : {gpt_task(8, 8), mlp_task(8, 8)}) {
    const bool gpt = task.batches[0].first.scalar_type() == torch::kLong;
    const RefRun ref = reference(task, true);
    for (const std::string& plan : {plan_2d(gpt ? kGptRules : kMlpRules, kZero2), plan_dp(kZero2)}) {
      SCOPED_TRACE(plan.substr(0, 40));
      expect_same_losses(run_dp(task, {plan, true, 2}, ref), ref.losses);
      DpCase every{plan, true, 2};
      every.sync = DpCase::every_syncs;
      every.loop = Loop::optimizer;
      expect_same_losses(run_dp(task, every, ref), ref.losses);
      DpCase none{plan, true, 2};
      none.sync = DpCase::none_syncs;
      none.loop = Loop::optimizer;
      expect_same_losses(run_dp(task, none, ref), ref.losses);
    }
  }
}

// After backward, ZeRO-2 holds its slices only (every .grad dropped, every
// flat bucket released); ZeRO-1 the whole buckets, its slices inside them.
TEST(ZeroTwo, OnlySlicesOutliveBackward) {
  const Task task = gpt_task(2, 8);
  for (int stage : {1, 2}) {
    const auto plan = shardplan::parse_plan(
        plan_2d(kGptRules, "data_parallel: {zero: " + std::to_string(stage) + ", bucket_mb: 0.001}\n"));
    std::vector<std::shared_ptr<torch::nn::Module>> replicas;
    for (int r = 0; r < 4; ++r) replicas.push_back(task.model->clone());
    std::mutex mu;
    shardplan::run_ranks_in_threads(4, [&](shardplan::World& w) {
      auto& model = *replicas[w.rank()];
      shardplan::Training t = shardplan::parallelize_for_training(model, plan, w);
      DataParallel& dp = *t.data_parallel;
      shardplan::Optimizer opt(dp, [](std::vector<torch::Tensor> p) { return make_opt(true, p); });
      int64_t padded = 0, param_bytes = 0;
      for (const auto& b : dp.buckets()) padded += b.padded * b.element_size;
      std::set<const void*> seen;  // a tied tensor once
      for (const auto& p : model.parameters())
        if (seen.insert(p.storage().unsafeGetStorageImpl()).second) param_bytes += p.numel() * p.element_size();
      for (const auto& [x, y] : task.batches) {
        opt.zero_grad();
        task.loss(model, t.local_batch(x), t.local_batch(y)).backward();
        const shardplan::StateBytes s = shardplan::state_bytes(opt);
        {
          std::lock_guard<std::mutex> lock(mu);
          EXPECT_EQ(dp.zero_stage(), stage);
          for (const auto& p : model.parameters()) EXPECT_FALSE(p.grad().defined()) << "stage " << stage;
          // ZeRO-1's slice is part of its bucket; ZeRO-2's is all there is.
          EXPECT_EQ(s.grads, stage == 1 ? padded : padded / 2) << "stage " << stage << " rank " << w.rank();
          EXPECT_EQ(s.params, param_bytes);
          EXPECT_EQ(s.copies, 0) << "the optimizer steps views of the parameters";
        }
        opt.step();  // collective: outside the lock
      }
    });
  }
}

}  // namespace test_zero2
