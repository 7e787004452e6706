// Clipping what a mixed-precision shardplan::Optimizer steps: the float32
// master gradients (plain and ZeRO-1), counted once over tensor-parallel
// shards, and with a loss scaler unscaled first (GradScaler.unscale_, then
// clip), against one process clipping its float32 gradients.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mlp_model.h"
#include "shardplan/checkpoint.h"
#include "shardplan/clip_grad.h"
#include "shardplan/data_parallel.h"
#include "shardplan/mixed_precision.h"
#include "shardplan/optimizer.h"
#include "shardplan/plan.h"
#include "shardplan/training.h"
#include "shardplan/world.h"

namespace test_mixed_precision_clip {

using mlp_model::Mlp;
using mlp_model::MlpImpl;

constexpr int kSteps = 3;
constexpr double kMaxNorm = 0.05;  // below every step's norm: every step clips

std::unique_ptr<torch::optim::Optimizer> adam(std::vector<torch::Tensor> p) {
  return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2));
}

struct Data {
  Mlp model{nullptr};
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
};

Data make_data(torch::ScalarType dtype) {
  torch::manual_seed(21);
  Data d;
  d.model = Mlp();
  d.model->to(dtype);
  for (int i = 0; i < kSteps; ++i)
    d.batches.emplace_back(torch::randn({8, 6}).to(dtype), torch::randn({8, 3}).to(dtype));
  return d;
}

struct Result {
  std::vector<double> norms;
  std::vector<torch::Tensor> params;
};

// One process: the gradient of the whole batch in the model's dtype, cast
// to the masters' dtype, clipped by torch's rule over all of it, Adam on
// the masters. `ranks` splits the batch as the data-parallel run does (each
// rank's half, times 1/2, summed: exact for 2).
Result reference(const Data& data, torch::ScalarType master, int ranks) {
  auto model = std::dynamic_pointer_cast<MlpImpl>(data.model->clone());
  std::vector<torch::Tensor> params = model->parameters(), masters;
  for (const auto& p : params) masters.push_back(p.detach().to(master).clone().requires_grad_(true));
  auto opt = adam(masters);
  Result r;
  for (const auto& [x, y] : data.batches) {
    std::vector<torch::Tensor> total(params.size());
    const int64_t n = x.size(0) / ranks;
    for (int k = 0; k < ranks; ++k) {
      auto grads = torch::autograd::grad({model->loss(x.narrow(0, k * n, n), y.narrow(0, k * n, n))}, params);
      for (size_t i = 0; i < params.size(); ++i) {
        auto g = torch::zeros(params[i].sizes(), master).add_(grads[i], 1.0 / ranks);
        total[i] = total[i].defined() ? total[i].add_(g) : g;
      }
    }
    // Each tensor's norm in its own dtype, as torch's clip_grad_norm_ takes it.
    double sq = 0;
    for (const auto& g : total) sq += std::pow(g.norm().item<double>(), 2);
    const double norm = std::sqrt(sq), coef = kMaxNorm / (norm + 1e-6);
    EXPECT_LT(coef, 1) << "the step does not clip";
    for (size_t i = 0; i < params.size(); ++i) masters[i].mutable_grad() = total[i].mul_(coef);
    opt->step();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(masters[i]);
    r.norms.push_back(norm);
  }
  for (const auto& m : masters) r.params.push_back(m.detach().to(torch::kDouble));
  return r;
}

struct Case {
  std::string plan;
  int world = 2;
  torch::ScalarType model = torch::kBFloat16, master = torch::kFloat;
  bool scaler = false;
  bool via_data_parallel = false;  // clip_grad_norm_(DataParallel&) instead of the Optimizer's
};

Result run(const Data& data, const Case& c) {
  const auto plan = shardplan::parse_plan(c.plan, "clip.yaml");
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < c.world; ++r) replicas.push_back(data.model->clone());
  Result out;
  std::vector<std::vector<double>> rank_norms(c.world);
  std::mutex mu;
  shardplan::run_ranks_in_threads(c.world, [&](shardplan::World& w) {
    auto& model = dynamic_cast<MlpImpl&>(*replicas[w.rank()]);
    auto t = shardplan::parallelize_for_training(model, plan, w);
    shardplan::MixedPrecision mp;
    mp.master_dtype = c.master;
    if (c.scaler) mp.loss_scaler = shardplan::LossScalerOptions{};
    shardplan::Optimizer opt(*t.data_parallel, adam, mp);
    std::vector<double> norms;
    for (const auto& [x, y] : data.batches) {
      opt.zero_grad();
      opt.scale_loss(model.loss(t.local_batch(x), t.local_batch(y))).backward();
      norms.push_back(c.via_data_parallel ? shardplan::clip_grad_norm_(*t.data_parallel, kMaxNorm)
                                          : shardplan::clip_grad_norm_(opt, kMaxNorm));
      opt.step();
      EXPECT_FALSE(opt.last_step_skipped());
    }
    auto whole = shardplan::collect_state_dict(model, t.report, w, -1);  // the model, rounded masters
    std::lock_guard<std::mutex> lock(mu);
    rank_norms[w.rank()] = norms;
    if (w.rank() != 0) return;
    out.norms = norms;
    for (const auto& [name, tensor] : whole) out.params.push_back(tensor.to(torch::kDouble));
  });
  for (int r = 1; r < c.world; ++r) EXPECT_EQ(rank_norms[r], rank_norms[0]) << "rank " << r << "'s norms differ";
  return out;
}

void expect_close(const Result& got, const Result& want, double norm_tol, double param_tol) {
  ASSERT_EQ(got.norms.size(), want.norms.size());
  for (size_t k = 0; k < want.norms.size(); ++k)
    EXPECT_NEAR(got.norms[k], want.norms[k], norm_tol * want.norms[k]) << "step " << k;
  ASSERT_EQ(got.params.size(), want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i)
    EXPECT_LE((got.params[i] - want.params[i]).abs().max().item<double>(), param_tol) << "parameter " << i;
}

// The model's parameters are the masters rounded: compare them so.
Result rounded(Result r, torch::ScalarType dtype) {
  for (auto& p : r.params) p = p.to(dtype).to(torch::kDouble);
  return r;
}

TEST(MixedPrecisionClip, ClipsTheFloat32MastersPlainAndZero) {
  const Data data = make_data(torch::kBFloat16);
  const Result want = rounded(reference(data, torch::kFloat, 2), torch::kBFloat16);
  for (const char* zero : {"false", "true"}) {
    const std::string plan = std::string("version: 1\nmesh: {data: 2}\ndata_parallel: {zero: ") + zero + "}\nrules: []\n";
    // float32 norms of differently cut pieces (ZeRO's slices) differ in the
    // last bits of float32; the parameters, rounded to bfloat16, do not.
    expect_close(run(data, {plan}), want, 1e-6, 0);
  }
}

// Without a loss scaler the DataParallel overload reads the same float32
// gradients: the buckets the masters' .grad views, or ZeRO's slices.
TEST(MixedPrecisionClip, DataParallelOverloadClipsTheMastersToo) {
  const Data data = make_data(torch::kBFloat16);
  const Result want = rounded(reference(data, torch::kFloat, 2), torch::kBFloat16);
  for (const char* zero : {"false", "true"}) {
    Case c{std::string("version: 1\nmesh: {data: 2}\ndata_parallel: {zero: ") + zero + "}\nrules: []\n"};
    c.via_data_parallel = true;
    expect_close(run(data, c), want, 1e-6, 0);
  }
}

TEST(MixedPrecisionClip, ALossScalerUnscalesBeforeClipping) {
  // Scaling the loss by 2^16 and the gradients back is exact in binary
  // floating point: the run with a scaler is the run without (its norms to
  // float32's cuts, its parameters bit for bit).
  const Data data = make_data(torch::kBFloat16);
  const Result want = rounded(reference(data, torch::kFloat, 2), torch::kBFloat16);
  for (const char* zero : {"false", "true"}) {
    Case c{std::string("version: 1\nmesh: {data: 2}\ndata_parallel: {zero: ") + zero + "}\nrules: []\n"};
    c.scaler = true;
    expect_close(run(data, c), want, 1e-6, 0);
  }
}

TEST(MixedPrecisionClip, CountsTensorParallelShardsOnce) {
  // float32 model, float64 masters, {data: 2, model: 2}: the masters'
  // gradients of fc1/fc2 are shards, fc3's replicas; the norm is the
  // unsharded model's (to float32's summation-order differences).
  const Data data = make_data(torch::kFloat);
  const Result want = rounded(reference(data, torch::kDouble, 2), torch::kFloat);
  Case c{std::string("version: 1\nmesh: {data: 2, model: 2}\n") + mlp_model::kMlpRules, 4, torch::kFloat,
         torch::kDouble};
  expect_close(run(data, c), want, 1e-6, 1e-5);
}

}  // namespace test_mixed_precision_clip
