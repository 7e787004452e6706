// Data parallelism over a plan's batch axis (shardplan/data_parallel.h,
// shardplan/zero_optimizer.h): the example GPT and an MLP trained 20 steps in
// float64 on 4 thread ranks, {data: 2, model: 2} and {data: 4}, must print the
// losses and end with the parameters of one process training on the global
// batch (1e-10), with Adam and SGD, with and without ZeRO-1, with gradient
// accumulation; replicas stay bit-identical; the consistency check and the
// ignore list behave as documented. The loop and bad input:
// test_data_parallel_loop.cpp.
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
#include "shardplan/mixed_precision.h"
#include "shardplan/optimizer.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/training.h"
#include "shardplan/world.h"
#include "shardplan/zero_optimizer.h"

namespace test_data_parallel {

namespace {

namespace ex = shardplan::examples;
using namespace dp_test;

// ------------------------------------------------------------ parity

TEST(DataParallel, GptMatchesOneProcessOnTheGlobalBatch) {
  const Task task = gpt_task(20, 8);
  for (bool adam : {true, false}) {
    const RefRun ref = reference(task, adam);
    for (const std::string& plan : {plan_2d(kGptRules), plan_dp()}) {
      SCOPED_TRACE(plan.substr(0, 40) + (adam ? " adam" : " sgd"));
      expect_same_losses(run_dp(task, {plan, adam}, ref), ref.losses);
    }
  }
}

// Sequence parallelism inside each model group (plans/gpt_sp.yaml on a 2-D
// mesh): the LayerNorms' gradients are all-reduced over the model axis by
// the plan, then averaged over the data axis by DataParallel; check_replicas
// in run_dp compares them across both.
TEST(DataParallel, SequenceParallelGptMatchesOneProcess) {
  std::ifstream in(std::string(SHARDPLAN_SOURCE_DIR) + "/tests/e2e/gpt_sp_2d.yaml");
  const std::string plan((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_NE(plan.find("sequence_parallel: {dim: 0}"), std::string::npos);
  const Task task = gpt_task(10, 8);
  const RefRun ref = reference(task, true);
  expect_same_losses(run_dp(task, {plan, true}, ref), ref.losses);
  expect_same_losses(run_dp(task, {plan + "data_parallel: {zero: true}\n", true}, ref), ref.losses);
  expect_same_losses(run_dp(task, {plan, true, 2}, ref), ref.losses);
}

TEST(DataParallel, MlpMatchesOneProcessOnTheGlobalBatch) {
  const Task task = mlp_task(20, 8);
  for (bool adam : {true, false}) {
    const RefRun ref = reference(task, adam);
    for (const std::string& plan : {plan_2d(kMlpRules), plan_dp()}) {
      SCOPED_TRACE(plan.substr(0, 40) + (adam ? " adam" : " sgd"));
      expect_same_losses(run_dp(task, {plan, adam}, ref), ref.losses);
    }
  }
}

TEST(DataParallel, ZeroOneMatchesOneProcess) {
  for (const Task& task : {gpt_task(20, 8), mlp_task(20, 8)})
    for (bool adam : {true, false}) {
      const bool gpt = task.batches[0].first.scalar_type() == torch::kLong;
      const RefRun ref = reference(task, adam);
      // Tiny buckets: several of them, and padding where a bucket does not divide by 4.
      const std::string zero = "data_parallel: {zero: true, bucket_mb: 0.001}\n";
      for (const std::string& plan : {plan_2d(gpt ? kGptRules : kMlpRules, zero), plan_dp(zero)}) {
        SCOPED_TRACE(plan.substr(0, 60) + (adam ? " adam" : " sgd"));
        expect_same_losses(run_dp(task, {plan, adam}, ref), ref.losses);
      }
    }
}

TEST(DataParallel, GradientAccumulationMatchesOneProcess) {
  for (const Task& task : {gpt_task(20, 8), mlp_task(20, 8)}) {
    const bool gpt = task.batches[0].first.scalar_type() == torch::kLong;
    const RefRun ref = reference(task, true);
    expect_same_losses(run_dp(task, {plan_2d(gpt ? kGptRules : kMlpRules), true, 2}, ref), ref.losses);
    expect_same_losses(run_dp(task, {plan_dp("data_parallel: {zero: true}\n"), true, 2}, ref), ref.losses);
    // Without overlap every bucket is reduced in finish(): the same numbers.
    expect_same_losses(run_dp(task, {plan_dp("data_parallel: {overlap: false, bucket_mb: 0.001}\n"), true, 2}, ref),
                       ref.losses);
  }
}

// ------------------------------------------------------------ parameters without a gradient

// An MLP with a layer no loss ever reaches (`spare`) and one a slice of the
// batch reaches only when its first sample's first feature is positive
// (`sometimes`), as a mixture-of-experts router or a conditional head would.
struct BranchyMlpImpl : torch::nn::Cloneable<BranchyMlpImpl> {
  // Without `spare` (clone() copies the flag; it would not keep a frozen
  // parameter frozen).
  explicit BranchyMlpImpl(bool with_spare = true) : with_spare(with_spare) { reset(); }
  void reset() override {
    fc1 = register_module("fc1", shardplan::nn::Linear(6, 16));
    fc2 = register_module("fc2", shardplan::nn::Linear(16, 8));
    fc3 = register_module("fc3", shardplan::nn::Linear(8, 3));
    sometimes = register_module("sometimes", shardplan::nn::Linear(3, 3));
    if (with_spare) spare = register_module("spare", shardplan::nn::Linear(3, 3));
  }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) {
    auto l = torch::mse_loss(fc3->forward(torch::relu(fc2->forward(torch::relu(fc1->forward(x))))), y);
    if (x[0][0].item<double>() > 0) l = l + 0.1 * sometimes->forward(y).pow(2).mean();
    return l;
  }
  bool with_spare;
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr}, sometimes{nullptr}, spare{nullptr};
};
TORCH_MODULE(BranchyMlp);

// 8 samples a step; slice boundaries every sample at the finest (4 ranks x 2
// micro-batches). `every_step`: some slice takes the branch in every step;
// otherwise every third step none does.
Task branchy_task(int steps, bool every_step, bool with_spare = true) {
  torch::manual_seed(5);
  Task t;
  t.model = BranchyMlp(with_spare).ptr();
  t.model->to(torch::kDouble);
  t.loss = [](torch::nn::Module& m, const torch::Tensor& x, const torch::Tensor& y) {
    return dynamic_cast<BranchyMlpImpl&>(m).loss(x, y);
  };
  torch::manual_seed(13);
  for (int s = 0; s < steps; ++s) {
    auto x = torch::randn({8, 6}, torch::kDouble);
    auto sign = torch::full({8}, -1.0, torch::kDouble);
    if (every_step || s % 3 != 2) {
      sign[0] = 1.0;               // the first slice's first sample at every slicing
      if (s % 2 == 0) sign[4] = 1.0;  // and the second half's
    }
    x.select(1, 0).copy_(x.select(1, 0).abs() * sign);
    t.batches.emplace_back(x, torch::randn({8, 3}, torch::kDouble));
  }
  return t;
}

// PyTorch DDP leaves .grad of a parameter no rank used as it was, and
// averages one that some ranks used; so must DataParallel, or Adam would move
// the unused one (its moments decay) where one process leaves it alone.
TEST(DataParallel, ParametersWithoutAGradientAreLeftAloneAsInOneProcess) {
  const Task task = branchy_task(9, false);
  struct Opt { bool adam, adamw; const char* name; };
  for (const Opt o : {Opt{true, false, "adam"}, Opt{true, true, "adamw"}, Opt{false, false, "sgd"}})
    for (const std::string& plan : {plan_2d(kMlpRules), plan_dp()})
      for (int micro : {1, 2}) {
        const int data = plan.find("data: 4") != std::string::npos ? 4 : 2;
        SCOPED_TRACE(plan.substr(0, 40) + " " + o.name + " micro " + std::to_string(micro));
        const RefRun ref = reference(task, o.adam, data * micro, o.adamw);
        ASSERT_TRUE(torch::equal(ref.params.at("spare.weight"), task.model->named_parameters()["spare.weight"]));
        DpCase c{plan, o.adam, micro};
        c.adamw = o.adamw;
        expect_same_losses(run_dp(task, c, ref), ref.losses);
      }
}

// ZeRO-1: a parameter some rank used is averaged and stepped as one process
// would; one no rank ever uses (`spare`) is left alone, no update and no
// Adam state, as DDP with Adam leaves it (it was an error before). One
// unused only in some steps: tests/test_zero_unused.cpp (this reference's
// 1.13 zero_grad() zeroes gradients, so its Adam moves such a parameter).
TEST(DataParallel, ZeroOneWithParametersSomeRanksDoNotUse) {
  const std::string zero = "data_parallel: {zero: true, bucket_mb: 0.001}\n";
  for (bool with_spare : {false, true}) {
    const Task task = branchy_task(6, true, with_spare);
    for (bool adam : {true, false}) {
      SCOPED_TRACE(std::string(with_spare ? "spare" : "no spare") + (adam ? " adam" : " sgd"));
      const RefRun ref = reference(task, adam, 4);
      expect_same_losses(run_dp(task, {plan_dp(zero), adam}, ref), ref.losses);
    }
  }
}

// ------------------------------------------------------------ buckets and traffic

TEST(DataParallel, BucketsInReverseOrderAndTrafficIsTheMinimum) {
  const Task task = mlp_task(1, 8);
  const auto plan = shardplan::parse_plan(plan_dp("data_parallel: {bucket_mb: 0.0005}\n"));
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < 4; ++r) replicas.push_back(task.model->clone());
  shardplan::run_ranks_in_threads(4, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    auto report = shardplan::parallelize(model, plan, w);
    DataParallel dp(model, report, plan, w);
    // 0.0005 MiB = 524 bytes: a bucket closes once it holds that much: fc3 and fc2 in one, fc1 in the next.
    ASSERT_GE(dp.buckets().size(), 2u);
    EXPECT_EQ(dp.buckets().front().params.front(), "fc3.bias");
    EXPECT_EQ(dp.buckets().back().params.back(), "fc1.weight");
    int64_t total = 0;
    for (const auto& b : dp.buckets()) {
      EXPECT_EQ(b.dtype, torch::kDouble);
      total += b.bytes();
    }
    EXPECT_EQ(total, (6 * 16 + 16 + 16 * 8 + 8 + 8 * 3 + 3) * 8);
    EXPECT_EQ(dp.grad_bytes(), total);
    dp.group()->reset_stats();
    task.loss(model, dp.local_batch(task.batches[0].first), dp.local_batch(task.batches[0].second)).backward();
    dp.finish();
    // All-reduce: each bucket handed over once, and a ring moves 2(D-1)/D of
    // it; the last one carries a float64 per parameter saying whether any
    // rank used it, so there is no call of its own.
    const int64_t flags = 6 * 8;
    EXPECT_EQ(dp.group()->stats().bytes, static_cast<uint64_t>(dp.step_bytes()));
    EXPECT_EQ(dp.step_bytes(), total + flags);
    EXPECT_EQ(dp.wire_bytes(), dp.min_wire_bytes() + 2 * 3 * flags / 4);
    EXPECT_EQ(dp.min_wire_bytes(), 2 * 3 * total / 4);
    EXPECT_EQ(dp.group()->stats().calls, dp.buckets().size());
    EXPECT_NE(dp.describe().find("theoretical minimum"), std::string::npos);
    // Gradients keep their dtype.
    for (const auto& p : model.parameters()) EXPECT_EQ(p.grad().scalar_type(), torch::kDouble);
    // .grad is the averaged bucket itself (nothing copied back after the
    // wait): the gradients of one bucket share its storage.
    auto params = model.named_parameters();
    const auto& first = dp.buckets().front().params;
    ASSERT_GE(first.size(), 2u);
    EXPECT_TRUE(params[first[0]].grad().storage().is_alias_of(params[first[1]].grad().storage()));
    EXPECT_FALSE(params[first[0]].grad().storage().is_alias_of(
        params[dp.buckets().back().params.back()].grad().storage()));
  });
}

TEST(DataParallel, ZeroKeepsOneDthOfTheOptimizerState) {
  const Task task = gpt_task(1, 8);
  const auto plan = shardplan::parse_plan(plan_dp("data_parallel: {zero: true}\n"));
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < 4; ++r) replicas.push_back(task.model->clone());
  int64_t params = 0;
  for (const auto& p : task.model->parameters()) params += p.numel() * 8;
  shardplan::run_ranks_in_threads(4, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    auto report = shardplan::parallelize(model, plan, w);
    DataParallel dp(model, report, plan, w);
    shardplan::ZeroOptimizer zero(dp, [](std::vector<torch::Tensor> p) { return make_opt(true, p); });
    task.loss(model, dp.local_batch(task.batches[0].first), dp.local_batch(task.batches[0].second)).backward();
    dp.finish();
    zero.step();
    // Adam: two moments of this rank's slice. One bucket: its padding (under
    // 4 elements, at the end of the last rank's slice) has no state.
    ASSERT_EQ(dp.buckets().size(), 1u);
    EXPECT_GT(zero.state_bytes(), 2 * params / 4 - 2 * 4 * 8);
    EXPECT_LT(zero.state_bytes(), 2 * params / 4 + 2 * 4 * 8);
  });
}

// ------------------------------------------------------------ consistency

TEST(DataParallel, ReplicaCheckNamesTheParameterThatDrifted) {
  // One step: only the broken parameter differs afterwards.
  const Task task = mlp_task(1, 8);
  const auto plan = shardplan::parse_plan(plan_2d(kMlpRules));
  for (const std::string& broken : {"fc3.bias", "fc2.bias", "fc1.weight"}) {
    std::vector<std::shared_ptr<torch::nn::Module>> replicas;
    for (int r = 0; r < 4; ++r) replicas.push_back(task.model->clone());
    std::mutex mu;
    std::vector<std::string> errors;
    shardplan::run_ranks_in_threads(4, [&](shardplan::World& w) {
      auto& model = *replicas[w.rank()];
      auto report = shardplan::parallelize(model, plan, w);
      DataParallel dp(model, report, plan, w);
      auto opt = make_opt(false, model.parameters());
      for (const auto& [x, y] : task.batches) {
        opt->zero_grad();
        {  // the local gradients, averaged only by finish()
          DataParallel::NoSync no_sync(dp);
          task.loss(model, dp.local_batch(x), dp.local_batch(y)).backward();
        }
        // A broken sync: rank 3 skips averaging one parameter's gradient.
        auto g = model.named_parameters()[broken].grad().clone();
        dp.finish();
        if (w.rank() == 3) model.named_parameters()[broken].mutable_grad().copy_(g);
        opt->step();
      }
      try {
        dp.check_replicas();
      } catch (const shardplan::Error& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(e.what());
      }
    });
    // Every rank throws: those of the groups involved name the parameter,
    // the others the world rank that found it.
    ASSERT_EQ(errors.size(), 4u) << broken;
    int naming = 0;
    for (const auto& e : errors) {
      if (e.find("parameter '" + broken + "' differs across the ranks of mesh axis") != std::string::npos) ++naming;
      else EXPECT_NE(e.find("found a parameter that differs across its replicas"), std::string::npos) << e;
    }
    EXPECT_GE(naming, 1) << broken;
  }
}

// ------------------------------------------------------------ what is not averaged

TEST(DataParallel, IgnoredAndBatchSplitParametersKeepTheirLocalGradients) {
  const Task task = mlp_task(1, 8);
  // fc1 is split over `data` itself (a layer a user shards over the batch
  // axis owns its slices per data rank); fc3.bias is ignored.
  const auto plan = shardplan::parse_plan(R"(version: 1
mesh: {data: 2}
data_parallel: {ignore: ['fc3\.bias', 'nothing\.here']}
rules:
  - match: 'fc1\.weight'
    layout: [data, null]
)");
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < 2; ++r) replicas.push_back(task.model->clone());
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    auto report = shardplan::parallelize(model, plan, w);
    DataParallel dp(model, report, plan, w);
    EXPECT_EQ(dp.ignored(), std::vector<std::string>{"fc3.bias"});
    EXPECT_EQ(dp.split(), (std::vector<std::string>{"fc1.weight", "fc1.bias"}));
    ASSERT_EQ(dp.warnings().size(), 1u);
    EXPECT_NE(dp.warnings()[0].find("data_parallel.ignore 'nothing\\.here' matches no parameter"), std::string::npos)
        << dp.warnings()[0];
    {  // the local gradients, averaged only by finish()
      DataParallel::NoSync no_sync(dp);
      task.loss(model, dp.local_batch(task.batches[0].first), dp.local_batch(task.batches[0].second)).backward();
    }
    auto params = model.named_parameters();
    std::map<std::string, torch::Tensor> before;
    for (const auto& p : params) before[p.key()] = p.value().grad().clone();
    dp.finish();
    for (const std::string& name : {"fc3.bias", "fc1.weight", "fc1.bias"})
      EXPECT_TRUE(torch::equal(params[name].grad(), before[name])) << name << " was changed";
    // The rest is averaged: different local batches, so the local gradient changed.
    EXPECT_FALSE(torch::equal(params["fc3.weight"].grad(), before["fc3.weight"]));
    auto sum = params["fc3.weight"].grad().clone();
    // Averaged gradients agree on both ranks; the ignored one does not.
    EXPECT_TRUE(torch::equal(dp.group()->all_gather(sum.unsqueeze(0), 0)[0],
                             dp.group()->all_gather(sum.unsqueeze(0), 0)[1]));
  });
}

// Under `paths: keras` every regex of the plan sees the Keras names, the
// ignore list too: a torch name there would match nothing and the parameter
// would silently be averaged after all.
TEST(DataParallel, KerasPathsReachTheIgnoreList) {
  const Task task = mlp_task(1, 8);
  for (const bool keras_pattern : {true, false}) {
    const auto plan = shardplan::parse_plan(std::string("version: 1\npaths: keras\nmesh: {data: 2}\n") +
                                                "data_parallel: {ignore: ['" + (keras_pattern ? "fc3/bias" : "fc3\\.bias") +
                                                "']}\nrules: []\n",
                                            "k.yaml");
    std::vector<std::shared_ptr<torch::nn::Module>> replicas;
    for (int r = 0; r < 2; ++r) replicas.push_back(task.model->clone());
    shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
      auto& model = *replicas[w.rank()];
      auto report = shardplan::parallelize(model, plan, w);
      for (const auto& row : report.rows)
        if (row.path == "fc3.bias") EXPECT_EQ(row.plan_path, "fc3/bias");
      DataParallel dp(model, report, plan, w);
      if (!keras_pattern) {
        // The torch name is not what the plan matches: warned, and averaged.
        EXPECT_TRUE(dp.ignored().empty());
        ASSERT_EQ(dp.warnings().size(), 1u);
        EXPECT_NE(dp.warnings()[0].find("matches no parameter"), std::string::npos) << dp.warnings()[0];
        return;
      }
      EXPECT_EQ(dp.ignored(), std::vector<std::string>{"fc3.bias"});
      EXPECT_TRUE(dp.warnings().empty());
      EXPECT_NE(dp.describe().find("fc3.bias (keras fc3/bias)"), std::string::npos) << dp.describe();
      task.loss(model, dp.local_batch(task.batches[0].first), dp.local_batch(task.batches[0].second)).backward();
      auto params = model.named_parameters();
      const torch::Tensor before = params["fc3.bias"].grad().clone();
      dp.finish();
      EXPECT_TRUE(torch::equal(params["fc3.bias"].grad(), before)) << "the ignored parameter was averaged";
      EXPECT_FALSE(torch::equal(dp.group()->all_gather(before.unsqueeze(0), 0)[0],
                                dp.group()->all_gather(before.unsqueeze(0), 0)[1]))
          << "the ranks' local gradients should differ for the check to mean anything";
    });
  }
}

// ZeRO steps parameters outside the buckets whole (ZeroOptimizer::locals(),
// exactness in Zero3.IgnoredAndBatchSplitParametersTrainAsWithoutZero), but
// ZeRO's master weights are its slices: masters are refused for them.
TEST(DataParallel, ZeroStepsParametersOutsideTheBucketsWhole) {
  const Task task = mlp_task(1, 8);
  for (const std::string& extra : {std::string("data_parallel: {zero: true, ignore: ['fc3\\.bias']}\nrules: []\n"),
                                   std::string("data_parallel: {zero: true}\nrules:\n"
                                               "  - {match: 'fc1\\.weight', layout: [data, null]}\n")}) {
    const auto plan = shardplan::parse_plan("version: 1\nmesh: {data: 2}\n" + extra, "z.yaml");
    std::vector<std::shared_ptr<torch::nn::Module>> replicas;
    for (int r = 0; r < 2; ++r) replicas.push_back(task.model->clone());
    shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
      auto& model = *replicas[w.rank()];
      auto report = shardplan::parallelize(model, plan, w);
      DataParallel dp(model, report, plan, w);
      const std::string local = dp.ignored().empty() ? "fc1.weight" : "fc3.bias";
      try {
        shardplan::MixedPrecision mixed;
        mixed.master_dtype = torch::kFloat;
        shardplan::Optimizer bad(dp, [](std::vector<torch::Tensor> p) { return make_opt(true, p); }, mixed);
        ADD_FAILURE() << "no error for " << extra;
      } catch (const shardplan::Error& e) {
        EXPECT_NE(std::string(e.what()).find("do not cover parameter '" + local + "'"), std::string::npos) << e.what();
      }
      shardplan::Optimizer opt(dp, [](std::vector<torch::Tensor> p) { return make_opt(true, p); });
      ASSERT_EQ(opt.zero()->locals().size(), dp.ignored().empty() ? 2u : 1u);  // fc1's weight and bias split
      auto params = model.named_parameters();
      const torch::Tensor before = params[local].detach().clone();
      task.loss(model, dp.local_batch(task.batches[0].first), dp.local_batch(task.batches[0].second)).backward();
      opt.step();
      EXPECT_FALSE(torch::equal(params[local], before)) << local << " was not stepped";
    });
  }
}

}  // namespace

}  // namespace test_data_parallel
