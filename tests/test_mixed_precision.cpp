// Mixed precision (shardplan/mixed_precision.h): float32 master weights and
// float32 gradient accumulation under shardplan::Optimizer, plain and ZeRO-1,
// against a one-process master-weights loop written here; the reduce dtype
// plan key; the loss scaler's skip decision across ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mlp_model.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/mixed_precision.h"
#include "shardplan/nn/cross_entropy.h"
#include "shardplan/nn/linear.h"
#include "shardplan/optimizer.h"
#include "shardplan/plan.h"
#include "shardplan/training.h"
#include "shardplan/world.h"

namespace test_mixed_precision {

using shardplan::DataParallel;
using shardplan::MixedPrecision;

using mlp_model::kMlpRules;
using mlp_model::Mlp;
using mlp_model::MlpImpl;

constexpr int kSteps = 4;
constexpr int64_t kBatch = 8;

struct Data {
  Mlp model{nullptr};  // bfloat16
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
};

Data make_data() {
  torch::manual_seed(5);
  Data d;
  d.model = Mlp();
  d.model->to(torch::kBFloat16);
  for (int i = 0; i < kSteps; ++i)
    d.batches.emplace_back(torch::randn({kBatch, 6}).to(torch::kBFloat16), torch::randn({kBatch, 3}).to(torch::kBFloat16));
  return d;
}

std::unique_ptr<torch::optim::Optimizer> adam(std::vector<torch::Tensor> p) {
  return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2));
}

struct Ref {
  std::vector<torch::Tensor> params, masters;  // named_parameters() order
};

// One process's master-weights loop, in the very order of operations the
// data-parallel run performs: each of D ranks adds its micro-batches'
// bfloat16 gradients, times 1/D, into a float32 buffer; the buffers are
// summed over the ranks (one reduction per step, or per backward when every
// backward synchronises: the rounds' averages are then added).
Ref reference(const Data& data, int ranks, int micro, bool every_syncs) {
  auto model = std::dynamic_pointer_cast<MlpImpl>(data.model->clone());
  std::vector<torch::Tensor> params = model->parameters(), masters;
  for (const auto& p : params) masters.push_back(p.detach().to(torch::kFloat).clone().requires_grad_(true));
  auto opt = adam(masters);
  for (const auto& [x, y] : data.batches) {
    const int64_t per_rank = kBatch / ranks, n = per_rank / micro;
    std::vector<torch::Tensor> total(params.size());
    for (int k = 0; k < (every_syncs ? micro : 1); ++k) {
      std::vector<std::vector<torch::Tensor>> acc(ranks, std::vector<torch::Tensor>(params.size()));
      for (int r = 0; r < ranks; ++r)
        for (int m = every_syncs ? k : 0; m < (every_syncs ? k + 1 : micro); ++m) {
          const int64_t lo = r * per_rank + m * n;
          auto loss = model->loss(x.narrow(0, lo, n), y.narrow(0, lo, n)) / micro;
          auto grads = torch::autograd::grad({loss}, params);
          for (size_t i = 0; i < params.size(); ++i) {
            if (!acc[r][i].defined()) acc[r][i] = torch::zeros(params[i].sizes(), torch::kFloat);
            acc[r][i].add_(grads[i], 1.0 / ranks);
          }
        }
      for (size_t i = 0; i < params.size(); ++i) {
        torch::Tensor sum = acc[0][i].clone();
        for (int r = 1; r < ranks; ++r) sum.add_(acc[r][i]);  // D <= 2 here: the order is immaterial
        total[i] = total[i].defined() ? sum.add_(total[i]) : sum;
      }
    }
    for (size_t i = 0; i < params.size(); ++i) masters[i].mutable_grad() = total[i];
    opt->step();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(masters[i]);
  }
  Ref r;
  for (size_t i = 0; i < params.size(); ++i) {
    r.params.push_back(params[i].detach().clone());
    r.masters.push_back(masters[i].detach().clone());
  }
  return r;
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

struct Case {
  std::string plan;
  int world = 2, ranks = 2, micro = 2;  // ranks: the batch axis' size
  bool every_syncs = false;
};

// The same loop on thread ranks with shardplan::Optimizer and float32
// masters: every rank's bfloat16 parameters and float32 masters must equal
// the reference's bit for bit.
void expect_like_reference(const Case& c) {
  const Data data = make_data();
  const Ref ref = reference(data, c.ranks, c.micro, c.every_syncs);
  const auto plan = shardplan::parse_plan(c.plan, "mixed.yaml");
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < c.world; ++r) replicas.push_back(data.model->clone());
  std::mutex mu;
  std::vector<std::string> problems;
  shardplan::run_ranks_in_threads(c.world, [&](shardplan::World& w) {
    auto& model = dynamic_cast<MlpImpl&>(*replicas[w.rank()]);
    auto t = shardplan::parallelize_for_training(model, plan, w);
    DataParallel& dp = *t.data_parallel;
    MixedPrecision mp;
    mp.master_dtype = torch::kFloat;
    shardplan::Optimizer opt(dp, adam, mp);
    EXPECT_TRUE(opt.masters());
    for (const auto& [gx, gy] : data.batches) {
      opt.zero_grad();
      const auto x = t.local_batch(gx), y = t.local_batch(gy);
      const int64_t n = x.size(0) / c.micro;
      for (int m = 0; m < c.micro; ++m) {
        auto loss = model.loss(x.narrow(0, m * n, n), y.narrow(0, m * n, n)) / c.micro;
        if (m + 1 < c.micro && !c.every_syncs) {
          DataParallel::NoSync no_sync(dp);
          loss.backward();
        } else {
          loss.backward();
        }
      }
      opt.step();
    }
    std::vector<torch::Tensor> masters;
    if (opt.zero())
      for (const auto& kv : opt.zero()->gather_masters()) masters.push_back(kv.second);
    else
      masters = opt.step_tensors();
    const auto params = model.parameters();
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(params[i].scalar_type(), torch::kBFloat16);
      if (max_diff(params[i], ref.params[i]) != 0)
        problems.push_back("rank " + std::to_string(w.rank()) + " parameter " + std::to_string(i) + " differs by " +
                           std::to_string(max_diff(params[i], ref.params[i])));
    }
    ASSERT_EQ(masters.size(), params.size());
    // ZeRO's buckets pack parameters in reverse: match masters by shape order.
    for (size_t i = 0; i < masters.size(); ++i) {
      const size_t j = opt.zero() ? masters.size() - 1 - i : i;
      EXPECT_EQ(masters[i].scalar_type(), torch::kFloat);
      if (max_diff(masters[i], ref.masters[j]) != 0)
        problems.push_back("rank " + std::to_string(w.rank()) + " master " + std::to_string(j) + " differs by " +
                           std::to_string(max_diff(masters[i], ref.masters[j])));
    }
  });
  for (const auto& p : problems) ADD_FAILURE() << p;
}

TEST(MixedPrecision, MastersPlainEqualReferenceLoop) {
  expect_like_reference({"version: 1\nmesh: {data: 2}\nrules: []\n"});
}

TEST(MixedPrecision, MastersEveryBackwardSyncsEqualReferenceLoop) {
  Case c{"version: 1\nmesh: {data: 2}\nrules: []\n"};
  c.every_syncs = true;
  expect_like_reference(c);
}

TEST(MixedPrecision, MastersZeroEqualReferenceLoop) {
  expect_like_reference({"version: 1\nmesh: {data: 2}\ndata_parallel: {zero: true}\nrules: []\n"});
}

// ZeRO-2: the float32 main grads live in the buckets only while they reduce.
TEST(MixedPrecision, MastersZeroTwoEqualReferenceLoop) {
  expect_like_reference({"version: 1\nmesh: {data: 2}\ndata_parallel: {zero: 2, bucket_mb: 0.001}\nrules: []\n"});
  Case c{"version: 1\nmesh: {data: 2}\ndata_parallel: {zero: 2, bucket_mb: 0.001}\nrules: []\n"};
  c.every_syncs = true;
  expect_like_reference(c);
}

TEST(MixedPrecision, MastersWithoutBatchAxisEqualReferenceLoop) {
  // Every training loop builds a DataParallel, of size 1 here: the float32
  // accumulation must not depend on a batch axis. (No rules: the layers'
  // tensor-parallel forms at size 1 round their bfloat16 sums otherwise.)
  Case c{"version: 1\nmesh: {model: 1}\nrules: []\n"};
  c.world = c.ranks = 1;
  c.micro = 4;
  expect_like_reference(c);
}

// data_parallel.reduce_dtype: bfloat16 rounds the float32 buckets for the
// all-reduce (ZeRO-1: the reduce-scatter): the averaged gradients are
// bfloat16 values within about bfloat16's precision of the float32
// reduction's, the same on both ranks (ZeRO-1: each rank's slice).
void expect_reduced_in_bfloat16(const std::string& zero) {
  const Data data = make_data();
  std::map<std::string, std::vector<torch::Tensor>> got;
  std::mutex mu;
  for (const std::string dtype : {"float32", "bfloat16"}) {
    const auto plan = shardplan::parse_plan("version: 1\nmesh: {data: 2}\ndata_parallel: {reduce_dtype: " + dtype +
                                                ", zero: " + zero + "}\nrules: []\n", "r.yaml");
    EXPECT_EQ(plan.data_parallel.reduce_dtype, dtype);
    std::vector<std::shared_ptr<torch::nn::Module>> replicas{data.model->clone(), data.model->clone()};
    shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
      auto& model = dynamic_cast<MlpImpl&>(*replicas[w.rank()]);
      auto t = shardplan::parallelize_for_training(model, plan, w);
      MixedPrecision mp;
      mp.master_dtype = torch::kFloat;
      shardplan::Optimizer opt(*t.data_parallel, adam, mp);
      const std::string described = t.data_parallel->describe();
      EXPECT_NE(described.find("reduced in " + std::string(dtype == "float32" ? "Float" : "BFloat16")),
                std::string::npos) << described;
      EXPECT_NE(described.find("gradients accumulate in Float"), std::string::npos) << described;
      const auto& [x, y] = data.batches[0];
      model.loss(t.local_batch(x), t.local_batch(y)).backward();
      auto grads = opt.step_grads();
      std::lock_guard<std::mutex> lock(mu);
      for (auto& g : grads) got[dtype + std::to_string(w.rank())].push_back(g.clone());
    });
  }
  double worst = 0;
  for (int r = 0; r < 2; ++r) {
    const auto& f = got["float32" + std::to_string(r)];
    const auto& b = got["bfloat16" + std::to_string(r)];
    ASSERT_EQ(f.size(), b.size());
    ASSERT_FALSE(f.empty());
    for (size_t i = 0; i < f.size(); ++i) {
      if (zero != "true") EXPECT_EQ(max_diff(b[i], got["bfloat161"][i]), 0);
      EXPECT_EQ(max_diff(b[i], b[i].to(torch::kBFloat16)), 0) << "a bfloat16 reduction leaves bfloat16 values";
      EXPECT_LE(max_diff(f[i], b[i]), f[i].abs().max().item<double>() * std::ldexp(1.0, -7));
      worst = std::max(worst, max_diff(f[i], b[i]));
    }
  }
  EXPECT_GT(worst, 0) << "the float32 reduction's gradients were bfloat16 values already";
}

TEST(MixedPrecision, ReduceDtypeBfloat16RoundsTheAverage) { expect_reduced_in_bfloat16("false"); }

TEST(MixedPrecision, ReduceDtypeBfloat16RoundsZeroSlices) { expect_reduced_in_bfloat16("true"); }

// reduce_dtype: float32 on pure bfloat16 buckets (no masters): the buckets
// go over the wire as float32 (twice the bytes) and the four ranks'
// gradients come back as their exact average rounded once to bfloat16.
TEST(MixedPrecision, ReduceDtypeFloat32ReducesBfloat16BucketsInFloat32) {
  const Data data = make_data();
  const auto& [x, y] = data.batches[0];
  constexpr int kRanks = 4;
  const int64_t n = kBatch / kRanks;
  std::vector<torch::Tensor> exact;  // the average of the ranks' own gradients, in float64
  for (int r = 0; r < kRanks; ++r) {
    auto m = std::dynamic_pointer_cast<MlpImpl>(data.model->clone());
    m->loss(x.narrow(0, r * n, n), y.narrow(0, r * n, n)).backward();
    const auto ps = m->parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      auto g = ps[i].grad().to(torch::kDouble) / kRanks;
      if (exact.size() <= i) exact.push_back(g); else exact[i].add_(g);
    }
  }
  std::map<std::string, int64_t> bytes;
  std::mutex mu;
  for (const std::string dtype : {"float32", "bfloat16"}) {
    const auto plan = shardplan::parse_plan("version: 1\nmesh: {data: 4}\ndata_parallel: {reduce_dtype: " + dtype +
                                                "}\nrules: []\n", "r.yaml");
    std::vector<std::shared_ptr<torch::nn::Module>> replicas;
    for (int r = 0; r < kRanks; ++r) replicas.push_back(data.model->clone());
    shardplan::run_ranks_in_threads(kRanks, [&](shardplan::World& w) {
      auto& model = dynamic_cast<MlpImpl&>(*replicas[w.rank()]);
      auto t = shardplan::parallelize_for_training(model, plan, w);
      model.loss(t.local_batch(x), t.local_batch(y)).backward();
      t.data_parallel->finish();
      const std::string described = t.data_parallel->describe();
      if (dtype == "float32") EXPECT_NE(described.find("reduced in Float"), std::string::npos) << described;
      const auto ps = model.parameters();
      for (size_t i = 0; i < ps.size(); ++i) {
        EXPECT_EQ(ps[i].grad().scalar_type(), torch::kBFloat16);
        EXPECT_EQ(max_diff(ps[i].grad(), exact[i].to(torch::kBFloat16)), 0) << dtype << ", parameter " << i;
      }
      std::lock_guard<std::mutex> lock(mu);
      bytes[dtype] = t.data_parallel->step_bytes();
    });
  }
  // The used flags (one a parameter) ride at the end of the last bucket, in its wire dtype too.
  int64_t elements = 0;
  for (const auto& p : data.model->parameters()) elements += p.numel() + 1;
  EXPECT_EQ(bytes["float32"] - bytes["bfloat16"], 2 * elements) << "the buckets did not go over the wire as float32";
}

TEST(MixedPrecision, ReduceDtypeBadValueNamesTheLine) {
  try {
    shardplan::parse_plan("version: 1\nmesh: {data: 2}\ndata_parallel:\n  reduce_dtype: int8\nrules: []\n", "p.yaml");
    FAIL() << "no error";
  } catch (const shardplan::PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("p.yaml:4:17"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("reduce_dtype"), std::string::npos) << e.what();
  }
  const auto plan =
      shardplan::parse_plan("version: 1\nmesh: {data: 2}\ndata_parallel: {reduce_dtype: bfloat16}\nrules: []\n", "p.yaml");
  EXPECT_NE(plan.to_yaml().find("reduce_dtype: bfloat16"), std::string::npos) << plan.to_yaml();
  // The plan fuzzer's seed with every data_parallel key reads back from its canonical form.
  const auto seed = shardplan::load_plan(std::string(SHARDPLAN_SOURCE_DIR) + "/tests/fuzz/plans/data_parallel.yaml");
  const auto again = shardplan::parse_plan(seed.to_yaml(), "again.yaml");
  EXPECT_EQ(again.data_parallel.reduce_dtype, "bfloat16");
  EXPECT_TRUE(again.data_parallel.zero);
  EXPECT_EQ(again.to_yaml(), seed.to_yaml());
}

TEST(LossScaler, GrowsAndBacksOffAsGradScaler) {
  shardplan::LossScalerOptions o;
  o.growth_interval = 2;
  shardplan::LossScaler s(o);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.scale_loss(torch::ones({1})).item<float>(), 65536.0f);
  s.update(false);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.growth_tracker(), 1);
  s.update(false);
  EXPECT_EQ(s.scale(), 131072.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  s.update(false);
  s.update(true);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  s.update(false);
  const auto state = s.state();
  EXPECT_EQ(state.at("loss_scale"), "65536");
  EXPECT_EQ(state.at("loss_scale_growth_tracker"), "1");
  shardplan::LossScaler t;
  t.load_state(state);
  EXPECT_EQ(t.scale(), 65536.0);
  EXPECT_EQ(t.growth_tracker(), 1);
  // A bad value names its key and changes nothing.
  for (const auto& bad : std::vector<std::map<std::string, std::string>>{
           {{"loss_scale", "12x"}}, {{"loss_scale", "-1"}}, {{"loss_scale", "inf"}},
           {{"loss_scale", "8"}, {"loss_scale_growth_tracker", "-2"}}}) {
    try {
      t.load_state(bad);
      ADD_FAILURE() << "no error for " << bad.begin()->second;
    } catch (const shardplan::Error& e) {
      EXPECT_NE(std::string(e.what()).find("loss_scale"), std::string::npos) << e.what();
    }
    EXPECT_EQ(t.scale(), 65536.0);
    EXPECT_EQ(t.growth_tracker(), 1);
  }
  o.backoff_factor = 1.5;
  EXPECT_THROW(shardplan::LossScaler{o}, shardplan::Error);
}

TEST(LossScaler, WhatTrainerFlagsAskFor) {
  EXPECT_EQ(shardplan::dtype_from_name("bfloat16", "--dtype"), torch::kBFloat16);
  EXPECT_EQ(shardplan::dtype_from_name("fp16", "--dtype"), torch::kHalf);
  try {
    shardplan::dtype_from_name("bf15", "--master");
    ADD_FAILURE() << "no error";
  } catch (const shardplan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--master: unknown dtype 'bf15'"), std::string::npos) << e.what();
  }
  auto mp = shardplan::mixed_precision_for(torch::kBFloat16, torch::kFloat);
  EXPECT_EQ(mp.master_dtype, torch::kFloat);
  EXPECT_FALSE(mp.loss_scaler);
  mp = shardplan::mixed_precision_for(torch::kBFloat16, torch::kBFloat16);
  EXPECT_FALSE(mp.master_dtype);
  mp = shardplan::mixed_precision_for(torch::kHalf, torch::kFloat);
  EXPECT_EQ(mp.master_dtype, torch::kFloat);
  ASSERT_TRUE(mp.loss_scaler);
  EXPECT_EQ(mp.loss_scaler->init_scale, 65536.0);
  EXPECT_EQ(mp.loss_scaler->growth_interval, 2000);
}

TEST(LossScaler, Float16WithoutScalerIsRefusedWhereTheOptimizerIsBuilt) {
  Mlp model;
  model->to(torch::kHalf);
  const auto plan = shardplan::parse_plan(std::string("version: 1\nmesh: {model: 1}\n") + kMlpRules, "h.yaml");
  shardplan::run_ranks_in_threads(1, [&](shardplan::World& w) {
    auto t = shardplan::parallelize_for_training(*model, plan, w);
    MixedPrecision mp;
    mp.master_dtype = torch::kFloat;
    try {
      shardplan::Optimizer opt(*t.data_parallel, adam, mp);
      ADD_FAILURE() << "no error";
    } catch (const shardplan::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("float16"), std::string::npos) << what;
      EXPECT_NE(what.find("loss_scaler"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
    // Nothing changed: the same DataParallel takes an optimizer with a scaler.
    mp.loss_scaler = shardplan::LossScalerOptions{};
    shardplan::Optimizer opt(*t.data_parallel, adam, mp);
    EXPECT_TRUE(opt.masters());
    EXPECT_EQ(opt.scale_loss(torch::ones({1})).item<float>(), 65536.0f);
  });
}

// An inf in one rank's gradients (a shard under tensor parallelism, a slice
// under ZeRO-1: no other rank sees it) must make every rank skip, and the
// scale back off alike; the next clean step updates everywhere.
void expect_skip_everywhere(const std::string& plan_text, bool masters) {
  const Data data = make_data();
  const auto plan = shardplan::parse_plan(plan_text, "inf.yaml");
  std::vector<std::shared_ptr<torch::nn::Module>> replicas{data.model->clone(), data.model->clone()};
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
    auto& model = dynamic_cast<MlpImpl&>(*replicas[w.rank()]);
    if (!masters) model.to(torch::kFloat);
    auto t = shardplan::parallelize_for_training(model, plan, w);
    MixedPrecision mp;
    if (masters) mp.master_dtype = torch::kFloat;
    mp.loss_scaler = shardplan::LossScalerOptions{};
    shardplan::Optimizer opt(*t.data_parallel, adam, mp);
    std::vector<torch::Tensor> before;
    for (const auto& p : model.parameters()) before.push_back(p.detach().clone());
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      const auto& [x, y] = data.batches[step];
      auto xl = t.local_batch(x.to(model.fc1->weight.scalar_type()));
      auto yl = t.local_batch(y.to(model.fc1->weight.scalar_type()));
      opt.scale_loss(model.loss(xl, yl)).backward();
      if (step == 0 && w.rank() == 1) {
        auto grads = opt.step_grads();
        ASSERT_FALSE(grads.empty());
        grads.back().view(-1)[0] = std::numeric_limits<float>::infinity();
      }
      opt.step();
      const auto params = model.parameters();
      double moved = 0;
      for (size_t i = 0; i < params.size(); ++i) moved = std::max(moved, max_diff(params[i], before[i]));
      if (step == 0) {
        EXPECT_TRUE(opt.last_step_skipped()) << "rank " << w.rank();
        EXPECT_EQ(moved, 0) << "rank " << w.rank();
        EXPECT_EQ(opt.loss_scaler()->scale(), 32768.0) << "rank " << w.rank();
      } else {
        EXPECT_FALSE(opt.last_step_skipped()) << "rank " << w.rank();
        EXPECT_GT(moved, 0) << "rank " << w.rank();
        EXPECT_EQ(opt.loss_scaler()->scale(), 32768.0);
        EXPECT_EQ(opt.loss_scaler()->growth_tracker(), 1);
      }
    }
  });
}

TEST(LossScaler, InfInOneTensorParallelShardSkipsEveryRank) {
  expect_skip_everywhere(std::string("version: 1\nmesh: {model: 2}\n") + kMlpRules, false);
}

TEST(LossScaler, InfInOneZeroSliceSkipsEveryRank) {
  expect_skip_everywhere("version: 1\nmesh: {data: 2}\ndata_parallel: {zero: true}\nrules: []\n", true);
}

// float16 end to end (element-wise ops only: libtorch 1.13 has no float16
// matmul on CPU): {data: 2}, float32 masters, a loss scaler starting high
// enough that rank 1's gradients overflow. Every step, the skip decision,
// the scale and the weights equal a one-process loop doing the same in the
// same order (GradScaler's unscale, check, step or skip, update).
struct LinImpl : torch::nn::Cloneable<LinImpl> {
  LinImpl() { reset(); }
  void reset() override {
    w = register_parameter("w", torch::randn({4}));
    b = register_parameter("b", torch::zeros({1}));
  }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) { return ((x * w).sum(1) + b - y).pow(2).mean(); }
  torch::Tensor w, b;
};
TORCH_MODULE(Lin);

TEST(LossScaler, Float16TrainingSkipsAndBacksOffAsAOneProcessLoop) {
  torch::manual_seed(13);
  Lin init;
  init->to(torch::kHalf);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
  for (int i = 0; i < 12; ++i) {
    auto x = torch::randn({8, 4}), y = torch::randn({8});
    x.narrow(0, 4, 4).mul_(30);  // rank 1's rows: a scaled loss far past float16's 65504
    y.narrow(0, 4, 4).mul_(30);
    data.emplace_back(x.to(torch::kHalf), y.to(torch::kHalf));
  }
  shardplan::LossScalerOptions so;
  so.init_scale = 1024;
  so.growth_interval = 3;
  // The reference.
  auto ref = std::dynamic_pointer_cast<LinImpl>(init->clone());
  std::vector<torch::Tensor> params = ref->parameters(), masters;
  for (const auto& p : params) masters.push_back(p.detach().to(torch::kFloat).clone().requires_grad_(true));
  auto ref_opt = adam(masters);
  shardplan::LossScaler ref_scaler(so);
  std::vector<std::pair<bool, double>> want;  // per step: skipped, scale after
  for (const auto& [x, y] : data) {
    std::vector<torch::Tensor> total(params.size());
    for (int r = 0; r < 2; ++r) {
      auto loss = ref->loss(x.narrow(0, 4 * r, 4), y.narrow(0, 4 * r, 4)) * ref_scaler.scale();
      auto grads = torch::autograd::grad({loss}, params);
      for (size_t i = 0; i < params.size(); ++i) {
        auto acc = torch::zeros(params[i].sizes(), torch::kFloat).add_(grads[i], 0.5);
        total[i] = total[i].defined() ? total[i].add_(acc) : acc;
      }
    }
    bool inf = false;
    for (auto& g : total) {
      g.mul_(1.0 / ref_scaler.scale());
      inf = inf || !torch::isfinite(g).all().item<bool>();
    }
    if (!inf) {
      for (size_t i = 0; i < params.size(); ++i) masters[i].mutable_grad() = total[i];
      ref_opt->step();
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) params[i].copy_(masters[i]);
    }
    ref_scaler.update(inf);
    want.emplace_back(inf, ref_scaler.scale());
  }
  size_t skipped = 0, stepped = 0;
  for (const auto& [s, scale] : want) (s ? skipped : stepped)++;
  ASSERT_GT(skipped, 2u);
  ASSERT_GT(stepped, 2u);
  const auto plan = shardplan::parse_plan("version: 1\nmesh: {data: 2}\nrules: []\n", "f16.yaml");
  std::vector<std::shared_ptr<torch::nn::Module>> replicas{init->clone(), init->clone()};
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
    auto& model = dynamic_cast<LinImpl&>(*replicas[w.rank()]);
    auto t = shardplan::parallelize_for_training(model, plan, w);
    MixedPrecision mp;
    mp.master_dtype = torch::kFloat;
    mp.loss_scaler = so;
    shardplan::Optimizer opt(*t.data_parallel, adam, mp);
    for (size_t step = 0; step < data.size(); ++step) {
      opt.zero_grad();
      opt.scale_loss(model.loss(t.local_batch(data[step].first), t.local_batch(data[step].second))).backward();
      opt.step();
      EXPECT_EQ(opt.last_step_skipped(), want[step].first) << "rank " << w.rank() << " step " << step;
      EXPECT_EQ(opt.loss_scaler()->scale(), want[step].second) << "rank " << w.rank() << " step " << step;
    }
    const auto got = model.parameters();
    const auto got_masters = opt.step_tensors();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(max_diff(got[i], params[i]), 0) << "rank " << w.rank();
      EXPECT_EQ(max_diff(got_masters[i], masters[i]), 0) << "rank " << w.rank();
    }
  });
}

TEST(MixedPrecision, CrossEntropyOfHalfLogitsIsFloat32ShardedAndUnsharded) {
  // As Megatron's logits.float(): the loss of bfloat16 / float16 logits is
  // computed and returned in float32, vocab-parallel and unsharded alike,
  // and the logits' gradient keeps their dtype.
  torch::manual_seed(6);
  const auto logits = torch::randn({6, 8}) * 4;
  const auto target = torch::randint(8, {6}, torch::kLong);
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
    const auto x = logits.to(dtype);
    const double want = torch::nn::functional::cross_entropy(x.to(torch::kDouble), target).item<double>();
    shardplan::nn::CrossEntropyLoss unsharded;
    auto xu = x.clone().requires_grad_(true);
    auto lu = unsharded(xu, target);
    EXPECT_EQ(lu.scalar_type(), torch::kFloat);
    EXPECT_NEAR(lu.item<double>(), want, 1e-6 * want);
    lu.backward();
    EXPECT_EQ(xu.grad().scalar_type(), dtype);
    const auto whole_grad = xu.grad().to(torch::kDouble);
    shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
      auto mine = x.narrow(1, 4 * w.rank(), 4).clone().requires_grad_(true);
      auto loss = shardplan::vocab_parallel_cross_entropy(mine, target, w.comm());
      EXPECT_EQ(loss.scalar_type(), torch::kFloat);
      EXPECT_NEAR(loss.item<double>(), want, 1e-6 * want);
      loss.backward();
      EXPECT_EQ(mine.grad().scalar_type(), dtype);
      // Both gradients are float32 values rounded once to the logits' dtype.
      const auto diff = (mine.grad().to(torch::kDouble) - whole_grad.narrow(1, 4 * w.rank(), 4)).abs().max();
      EXPECT_LE(diff.item<double>(), std::ldexp(1.0, -8) * whole_grad.abs().max().item<double>());
    });
  }
}

}  // namespace test_mixed_precision
