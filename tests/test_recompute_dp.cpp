// Recomputation under data parallelism: the example GPT at {data: 2,
// model: 2} on thread ranks (plans/gpt_2d.yaml), trained through
// DataParallel and shardplan::Optimizer with two micro-batches a step
// (the first under NoSync), with and without ZeRO-1, recomputing every block
// and against the same training without recomputation: losses and
// parameters after the steps equal in float64 to 1e-12; and in bfloat16
// with float32 master weights (main grads accumulated in the buckets),
// equal bit for bit. DataParallel throws
// when a gradient reaches its hook twice in one round, so these runs also
// show that each parameter's gradient arrives once, through the region's
// node in the outer backward.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "parity.h"
#include "shardplan/data_parallel.h"
#include "shardplan/mixed_precision.h"
#include "shardplan/optimizer.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/random.h"
#include "shardplan/training.h"
#include "shardplan/world.h"

namespace test_recompute_dp {

namespace {

namespace ex = shardplan::examples;

std::string gpt_2d(bool zero, bool recompute) {
  std::ifstream in(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/gpt_2d.yaml");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (zero) {
    const std::string from = "data_parallel: {bucket_mb: 25}";
    text.replace(text.find(from), from.size(), "data_parallel: {bucket_mb: 0.001, zero: true}");
  }
  if (recompute) text += "\nrecompute: ['blocks\\.\\d+']\n";
  return text;
}

struct Run {
  std::vector<double> losses;
  std::vector<std::pair<std::string, at::Tensor>> params;
};

// `masters`: the model in bfloat16 with float32 master weights, so the
// gradients accumulate in DataParallel's float32 buckets (main grads).
std::vector<Run> train(const std::string& plan_yaml, const std::vector<ex::Batch>& micro_batches,
                       bool masters = false) {
  torch::manual_seed(3);
  auto ref = ex::make_model("gpt", {{"vocab", "32"}, {"context", "8"}, {"embed", "16"}, {"heads", "4"},
                                    {"layers", "2"}, {"mlp", "32"}, {"dropout", "0.25"}})
                 .module;
  ref->to(masters ? torch::kBFloat16 : torch::kDouble);
  const auto plan = shardplan::parse_plan(plan_yaml, "gpt_2d.yaml");
  std::vector<Run> out(4);
  shardplan::run_ranks_in_threads(4, [&](shardplan::World& w) {
    auto m = ref->clone();
    shardplan::Training t = shardplan::parallelize_for_training(*m, plan, w);
    shardplan::manual_seed(w, 99, t.report.mesh);
    shardplan::MixedPrecision mp;
    if (masters) mp.master_dtype = torch::kFloat;
    shardplan::Optimizer opt(
        *t.data_parallel,
        [](std::vector<at::Tensor> p) {
          return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2));
        },
        mp);
    Run r;
    for (size_t i = 0; i < micro_batches.size(); i += 2) {
      opt.zero_grad();
      for (size_t k = i; k < i + 2; ++k) {
        const ex::Batch b{t.local_batch(micro_batches[k].input), t.local_batch(micro_batches[k].target)};
        at::Tensor loss = ex::as_example(m).model->loss(b) / 2;
        if (k == i) {
          shardplan::DataParallel::NoSync no_sync(*t.data_parallel);
          loss.backward();
        } else {
          loss.backward();
        }
        r.losses.push_back(t.average(loss.item<double>()));
      }
      opt.step();
    }
    for (const auto& p : m->named_parameters()) r.params.emplace_back(p.key(), p.value().detach().clone());
    out[w.rank()] = std::move(r);
  });
  return out;
}

std::string differences(const std::vector<Run>& a, const std::vector<Run>& b) {
  for (size_t rank = 0; rank < a.size(); ++rank) {
    for (size_t i = 0; i < a[rank].losses.size(); ++i)
      if (std::abs(a[rank].losses[i] - b[rank].losses[i]) > 1e-12)
        return "rank " + std::to_string(rank) + " loss " + std::to_string(i);
    for (size_t i = 0; i < a[rank].params.size(); ++i)
      if (parity::rel_err(a[rank].params[i].second.to(at::kDouble), b[rank].params[i].second.to(at::kDouble)) > 1e-12)
        return "rank " + std::to_string(rank) + " " + a[rank].params[i].first;
  }
  return "";
}

std::vector<ex::Batch> batches() {
  torch::manual_seed(8);
  std::vector<ex::Batch> out;
  for (int i = 0; i < 4; ++i)  // two steps of two micro-batches, 4 sequences each
    out.push_back({torch::randint(32, {4, 8}, torch::kLong), torch::randint(32, {4, 8}, torch::kLong)});
  return out;
}

}  // namespace

TEST(RecomputeDataParallel, TwoByTwoWithNoSyncEqualsNoRecomputation) {
  const auto data = batches();
  const auto with = train(gpt_2d(false, true), data);
  const auto without = train(gpt_2d(false, false), data);
  EXPECT_EQ(differences(with, without), "");
  EXPECT_NE(with[0].params[0].second.sum().item<double>(), 0);
}

TEST(RecomputeDataParallel, TwoByTwoWithZeroOneEqualsNoRecomputation) {
  const auto data = batches();
  const auto with = train(gpt_2d(true, true), data);
  const auto without = train(gpt_2d(true, false), data);
  EXPECT_EQ(differences(with, without), "");
}

TEST(RecomputeDataParallel, TwoByTwoWithMainGradsEqualsNoRecomputation) {
  const auto data = batches();
  for (bool zero : {false, true}) {
    const auto with = train(gpt_2d(zero, true), data, /*masters=*/true);
    const auto without = train(gpt_2d(zero, false), data, /*masters=*/true);
    EXPECT_EQ(differences(with, without), "") << (zero ? "ZeRO-1" : "");
  }
}

}  // namespace test_recompute_dp
