// How data parallelism uses the link (issue 38): the first bucket is capped
// at data_parallel.first_bucket_mb (DDP's 1 MiB) so that it reduces while
// backward goes on, the used flags ride in the last bucket's all-reduce
// (no call of their own), and neither changes a bit of the gradients.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../data_parallel_fixture.h"
#include "models/model.h"
#include "shardplan/data_parallel.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"
#include "shardplan/zero_optimizer.h"

namespace test_data_parallel_link {

namespace {

namespace ex = shardplan::examples;
using namespace dp_test;

using Grads = std::map<std::string, torch::Tensor>;

// Each rank's gradients after one backward and finish() under `plan`, and
// the calls and bytes its batch axis' group saw for them.
struct RankGrads {
  Grads grads;
  uint64_t calls = 0, bytes = 0;
  size_t buckets = 0;
  int64_t step_bytes = 0;
};

using OnRank = std::function<void(torch::nn::Module&, DataParallel&, shardplan::World&)>;

// `fn` on `world` thread ranks, each with its replica of `model` under `plan`.
void on_ranks(const torch::nn::Module& model, const std::string& plan_text, int world, const OnRank& fn) {
  const auto plan = shardplan::parse_plan(plan_text);
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(model.clone());
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    auto& m = *replicas[w.rank()];
    auto report = shardplan::parallelize(m, plan, w);
    DataParallel dp(m, report, plan, w);
    fn(m, dp, w);
  });
}

std::vector<RankGrads> one_step(const Task& task, const std::string& plan_text, int world = 4) {
  std::vector<RankGrads> out(world);
  on_ranks(*task.model, plan_text, world, [&](torch::nn::Module& model, DataParallel& dp, shardplan::World& w) {
    dp.group()->reset_stats();
    const auto& [x, y] = task.batches[0];
    task.loss(model, dp.local_batch(x), dp.local_batch(y)).backward();
    dp.finish();
    RankGrads& g = out[w.rank()];
    for (const auto& p : model.named_parameters())
      g.grads[p.key()] = p.value().grad().defined() ? p.value().grad().clone() : torch::Tensor();
    g.calls = dp.group()->stats().calls;
    g.bytes = dp.group()->stats().bytes;
    g.buckets = dp.buckets().size();
    g.step_bytes = dp.step_bytes();
  });
  return out;
}

std::string read_plan(const std::string& name) {
  std::ifstream in(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/" + name);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// ------------------------------------------------------------ the first bucket

// The example GPT as train_gpt builds it (float32, about 1.9 MB of
// gradients) under plans/data_parallel.yaml: 25 MiB buckets made it one,
// which could start only when backward ended.
TEST(DataParallelLink, TheGptsFirstBucketIsOneMiBOfItsLastLayers) {
  torch::manual_seed(1);
  auto model = ex::make_model("gpt").module;
  for (const std::string extra : {"", "data_parallel: {first_bucket_mb: 25}\n"}) {
    std::string text = read_plan("data_parallel.yaml");
    text.replace(text.find("\nrules:") + 1, 0, extra);
    on_ranks(*model, text, 2, [&](torch::nn::Module& m, DataParallel& dp, shardplan::World&) {
      const auto& b = dp.buckets();
      if (!extra.empty()) {
        EXPECT_EQ(b.size(), 1u);
        return;
      }
      ASSERT_EQ(b.size(), 2u);
      // Reverse registration order: backward's first gradients; the bucket
      // closes with the parameter that takes it to 1 MiB.
      EXPECT_EQ(b[0].params.front(), dp.averaged().back());
      EXPECT_EQ(b[1].params.back(), dp.averaged().front());
      const auto params = m.named_parameters();
      const int64_t last = params[b[0].params.back()].numel() * 4;
      EXPECT_GE(b[0].bytes(), 1 << 20);
      EXPECT_LT(b[0].bytes() - last, 1 << 20);
      EXPECT_EQ(b[0].bytes() + b[1].bytes(), dp.grad_bytes());
    });
  }
}

// The MLP (fc1 6x16, fc2 16x8, fc3 8x3, float64): fc3's 216 bytes close a
// first bucket of 0.0002 MiB (209 bytes); the rest is one 25 MiB bucket. The
// first bucket is never larger than bucket_mb (first_bucket_mb's default 1
// MiB under bucket_mb 0.0005: test_data_parallel.cpp's buckets).
TEST(DataParallelLink, FirstBucketMbCapsOnlyTheFirstBucket) {
  const Task task = mlp_task(1, 8);
  on_ranks(*task.model, plan_dp("data_parallel: {first_bucket_mb: 0.0002}\n"), 4,
           [&](torch::nn::Module&, DataParallel& dp, shardplan::World&) {
    ASSERT_EQ(dp.buckets().size(), 2u);
    EXPECT_EQ(dp.buckets()[0].params, (std::vector<std::string>{"fc3.bias", "fc3.weight"}));
    EXPECT_EQ(dp.buckets()[1].params,
              (std::vector<std::string>{"fc2.bias", "fc2.weight", "fc1.bias", "fc1.weight"}));
  });
}

// Each element's average is its own all-reduce's: any bucketing gives the
// one-bucket run's bits, on every rank (overlap on and off, in float32 on
// the wire too).
TEST(DataParallelLink, GradientsDoNotDependOnTheBuckets) {
  const Task task = gpt_task(1, 8);
  for (const std::string more : {"", ", overlap: false", ", reduce_dtype: float32"}) {
    SCOPED_TRACE(more);
    const auto one = one_step(task, plan_dp("data_parallel: {first_bucket_mb: 25" + more + "}\n"));
    const auto many = one_step(task, plan_dp("data_parallel: {first_bucket_mb: 0.001, bucket_mb: 0.003" + more + "}\n"));
    ASSERT_EQ(one[0].buckets, 1u);
    ASSERT_GE(many[0].buckets, 3u);
    for (size_t r = 0; r < one.size(); ++r)
      for (const auto& [path, g] : one[r].grads) {
        ASSERT_TRUE(g.defined()) << path;
        EXPECT_TRUE(torch::equal(g, many[r].grads.at(path))) << "rank " << r << " " << path;
      }
  }
}

// ------------------------------------------------------------ the used flags

// `often` has a gradient on rank 0 only, `never` on no rank: the first is
// averaged with the others' zeros, the second keeps .grad undefined (DDP's
// unused-parameter map), and the flags saying so cost no call of their own.
struct UnevenImpl : torch::nn::Cloneable<UnevenImpl> {
  UnevenImpl() { reset(); }
  void reset() override {
    always = register_module("always", shardplan::nn::Linear(4, 4));
    often = register_module("often", shardplan::nn::Linear(4, 4));
    never = register_module("never", shardplan::nn::Linear(4, 4));
  }
  torch::Tensor loss(const torch::Tensor& x, bool rank0) {
    auto l = always->forward(x).pow(2).mean();
    return rank0 ? l + often->forward(x).pow(2).mean() : l;
  }
  shardplan::nn::Linear always{nullptr}, often{nullptr}, never{nullptr};
};
TORCH_MODULE(Uneven);

TEST(DataParallelLink, UsedFlagsRideInTheLastBucket) {
  torch::manual_seed(7);
  Uneven model;
  model->to(torch::kDouble);
  const auto x = torch::randn({8, 4}, torch::kDouble);
  for (const std::string dp_keys : {"", "{bucket_mb: 0.0001}", "{reduce_dtype: float32}", "{zero: true}"}) {
    SCOPED_TRACE(dp_keys);
    const bool zero = dp_keys.find("zero") != std::string::npos;
    // Rank 0's gradient of often.weight alone, for the average.
    auto alone = std::dynamic_pointer_cast<UnevenImpl>(model->clone());
    alone->often->forward(x.narrow(0, 0, 2)).pow(2).mean().backward();
    const torch::Tensor want = alone->often->weight.grad() / 4;
    const std::string plan = plan_dp(dp_keys.empty() ? "" : "data_parallel: " + dp_keys + "\n");
    on_ranks(*model, plan, 4, [&](torch::nn::Module& module, DataParallel& dp, shardplan::World& w) {
      auto& m = dynamic_cast<UnevenImpl&>(module);
      std::unique_ptr<shardplan::ZeroOptimizer> opt;
      if (zero)
        opt = std::make_unique<shardplan::ZeroOptimizer>(
            dp, [](std::vector<torch::Tensor> p) { return make_opt(false, p); });
      dp.group()->reset_stats();
      m.loss(dp.local_batch(x), w.rank() == 0).backward();
      dp.finish();
      // ZeRO reduce-scatters: its flags keep a call of their own.
      EXPECT_EQ(dp.group()->stats().calls, dp.buckets().size() + (zero ? 1 : 0));
      if (zero) return;
      EXPECT_EQ(dp.group()->stats().bytes, static_cast<uint64_t>(dp.step_bytes()));
      EXPECT_TRUE(m.always->weight.grad().defined());
      ASSERT_TRUE(m.often->weight.grad().defined()) << "rank " << w.rank();
      // Rank 0's gradient / 4 plus zeros: exact, but for a float32 wire.
      if (dp_keys.find("float32") == std::string::npos)
        EXPECT_TRUE(torch::equal(m.often->weight.grad(), want)) << "rank " << w.rank();
      else
        EXPECT_TRUE(torch::allclose(m.often->weight.grad(), want, 1e-6, 0)) << "rank " << w.rank();
      EXPECT_FALSE(m.never->weight.grad().defined()) << "rank " << w.rank();
      EXPECT_FALSE(m.never->bias.grad().defined()) << "rank " << w.rank();
    });
  }
}

}  // namespace

}  // namespace test_data_parallel_link
