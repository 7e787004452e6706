// shardplan::clip_grad_norm_ under data parallelism ({data: 2, model: 2},
// plain and ZeRO-1, through shardplan::Optimizer), with parameters in
// data_parallel.ignore, and on a TorchScript module sharded by
// parallelize_script: against torch::nn::utils::clip_grad_norm_ on one
// process training on the global batch (float64, 1e-12). And the replica
// check for any sharded model: the loop with torch's clip_grad_norm_
// on shards is caught at the first check, with ours it passes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "data_parallel_fixture.h"
#include "llama_fixture.h"
#include "parity.h"
#include "script/script_test_util.h"
#include "shardplan/checkpoint.h"
#include "shardplan/clip_grad.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/optimizer.h"
#include "shardplan/parallelize.h"
#include "shardplan/replicas.h"
#include "shardplan/script.h"
#include "shardplan/tied.h"
#include "shardplan/training.h"
#include "shardplan/world.h"

namespace test_clip_grad_dp {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
using shardplan::World;

struct Trial {
  std::vector<double> norms;
  std::map<std::string, torch::Tensor> params;
};

std::unique_ptr<torch::optim::Optimizer> sgd(const std::vector<torch::Tensor>& params) {
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
}

// One process on the global batch, torch's clip.
Trial torch_clipped(const dp_test::Task& task, double max_norm, double p) {
  auto m = task.model->clone();
  const auto params = shardplan::unique_parameters(*m);
  auto opt = sgd(params);
  Trial r;
  for (const auto& [x, y] : task.batches) {
    opt->zero_grad();
    task.loss(*m, x, y).backward();
    r.norms.push_back(torch::nn::utils::clip_grad_norm_(params, max_norm, p));
    opt->step();
  }
  for (const auto& kv : m->named_parameters()) r.params[kv.key()] = kv.value().detach().clone();
  return r;
}

// parallelize_for_training + shardplan::Optimizer (plain or ZeRO-1, as the
// plan says), clipped through the Optimizer overload; every rank's norms
// must be the same.
// `via_data_parallel`: clip through the DataParallel overload (the averaged
// .grad, or ZeRO's reduced slices) instead of the Optimizer's.
Trial data_parallel(const dp_test::Task& task, const std::string& plan_text, double max_norm, double p,
                    bool via_data_parallel = false) {
  const auto plan = shardplan::parse_plan(plan_text, "plan.yaml");
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  for (int r = 0; r < 4; ++r) models.push_back(task.model->clone());
  std::vector<std::vector<double>> norms(4);
  Trial out;
  std::mutex mu;
  shardplan::run_ranks_in_threads(4, [&](World& w) {
    auto& m = *models[w.rank()];
    auto t = shardplan::parallelize_for_training(m, plan, w);
    shardplan::Optimizer opt(*t.data_parallel, [](std::vector<at::Tensor> ps) { return sgd(ps); });
    for (const auto& [x, y] : task.batches) {
      opt.zero_grad();
      task.loss(m, t.local_batch(x), t.local_batch(y)).backward();
      norms[w.rank()].push_back(via_data_parallel ? shardplan::clip_grad_norm_(*t.data_parallel, max_norm, p)
                                                  : shardplan::clip_grad_norm_(opt, max_norm, p));
      opt.step();
    }
    t.data_parallel->check_replicas();
    auto full = shardplan::collect_state_dict(m, t.report, w, 0);
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [name, tensor] : full) out.params[name] = tensor;
  });
  for (int r = 1; r < 4; ++r) EXPECT_EQ(norms[r], norms[0]) << "rank " << r;
  out.norms = norms[0];
  return out;
}

void expect_same(const Trial& got, const Trial& want, double max_norm, const std::string& what) {
  ASSERT_EQ(got.norms.size(), want.norms.size()) << what;
  for (size_t s = 0; s < want.norms.size(); ++s) {
    EXPECT_GT(want.norms[s], max_norm * 1.01) << what << ": clips at every step";
    EXPECT_LE(std::abs(got.norms[s] - want.norms[s]), 1e-12 * std::max(1.0, want.norms[s]))
        << what << " step " << s << ": " << got.norms[s] << " vs " << want.norms[s];
  }
  for (const auto& [name, t] : want.params) {
    ASSERT_TRUE(got.params.count(name)) << what << ": " << name;
    EXPECT_LE(parity::rel_err(got.params.at(name), t), 1e-12) << what << ": " << name;
  }
}

TEST(ClipGradDp, DataTwoModelTwoPlainAndZeroEqualTorchOnTheGlobalBatch) {
  const auto task = dp_test::gpt_task(3, 4);
  for (double p : {2.0, 1.0, kInf}) {
    const double max_norm = p == kInf ? 0.01 : 0.1;
    const Trial want = torch_clipped(task, max_norm, p);
    const std::string what = "gpt {data: 2, model: 2} p=" + std::to_string(p);
    expect_same(data_parallel(task, dp_test::plan_2d(dp_test::kGptRules), max_norm, p), want, max_norm, what);
    // ZeRO-1: the norm is read from the reduced slices, small buckets so
    // that slices cut parameters (and the last one is padded).
    for (const char* stage : {"1", "2"})
      expect_same(data_parallel(task,
                                dp_test::plan_2d(dp_test::kGptRules,
                                                 "data_parallel: {zero: " + std::string(stage) + ", bucket_mb: 0.001}\n"),
                                max_norm, p),
                  want, max_norm, what + " zero " + stage);
  }
}

// The DataParallel overload scales what the optimizer then steps with:
// the averaged .grad, or under ZeRO the reduced slices ZeroOptimizer reads.
TEST(ClipGradDp, DataParallelOverloadPlainAndZero) {
  const auto task = dp_test::gpt_task(3, 4);
  for (double p : {2.0, kInf}) {
    const double max_norm = p == kInf ? 0.01 : 0.1;
    const Trial want = torch_clipped(task, max_norm, p);
    const std::string what = "DataParallel overload, gpt {data: 2, model: 2} p=" + std::to_string(p);
    expect_same(data_parallel(task, dp_test::plan_2d(dp_test::kGptRules), max_norm, p, true), want, max_norm, what);
    for (const char* stage : {"1", "2"})
      expect_same(data_parallel(task,
                                dp_test::plan_2d(dp_test::kGptRules,
                                                 "data_parallel: {zero: " + std::string(stage) + ", bucket_mb: 0.001}\n"),
                                max_norm, p, true),
                  want, max_norm, what + " zero " + stage);
  }
}

TEST(ClipGradDp, MlpOverFourDataRanksWithZero) {
  const auto task = dp_test::mlp_task(3, 8);
  const Trial want = torch_clipped(task, 0.05, 2);
  expect_same(data_parallel(task, dp_test::plan_dp(), 0.05, 2), want, 0.05, "mlp {data: 4}");
  for (const char* stage : {"1", "2"})
    expect_same(data_parallel(task, dp_test::plan_dp("data_parallel: {zero: " + std::string(stage) + ", bucket_mb: 0.0001}\n"),
                              0.05, 2),
                want, 0.05, "mlp {data: 4} zero " + std::string(stage));
}

// data_parallel.ignore: not averaged, so each data rank's gradient is its
// own (expert parameters): each counts on every data rank. The total is
// the norm of the averaged gradients and of every rank's own ones.
TEST(ClipGradDp, IgnoredParametersCountOnEveryDataRank) {
  const auto task = dp_test::mlp_task(1, 8);
  const auto& [x, y] = task.batches[0];
  double want2 = 0;
  {
    std::map<std::string, torch::Tensor> mean;
    for (int r = 0; r < 4; ++r) {
      auto m = task.model->clone();
      task.loss(*m, x.narrow(0, 2 * r, 2), y.narrow(0, 2 * r, 2)).backward();
      for (const auto& kv : m->named_parameters()) {
        const auto g = kv.value().grad();
        if (kv.key() == "fc3.bias")
          want2 += g.pow(2).sum().item<double>();
        else
          mean[kv.key()] = mean.count(kv.key()) ? mean[kv.key()] + g / 4 : g / 4;
      }
    }
    for (const auto& [name, g] : mean) want2 += g.pow(2).sum().item<double>();
  }
  const auto plan = shardplan::parse_plan(dp_test::plan_dp("data_parallel: {ignore: ['fc3\\.bias']}\n"), "p.yaml");
  std::vector<double> got(4);
  shardplan::run_ranks_in_threads(4, [&](World& w) {
    auto m = task.model->clone();
    auto t = shardplan::parallelize_for_training(*m, plan, w);
    ASSERT_EQ(t.data_parallel->ignored(), std::vector<std::string>{"fc3.bias"});
    task.loss(*m, t.local_batch(x), t.local_batch(y)).backward();
    got[w.rank()] = shardplan::grad_norm(*t.data_parallel);
  });
  for (int r = 0; r < 4; ++r) EXPECT_NEAR(got[r], std::sqrt(want2), 1e-12 * std::sqrt(want2)) << r;
}

// ------------------------------------------------------------ TorchScript

TEST(ClipGradDp, ScriptModuleEqualsTorchOnTheUnshardedModule) {
  using namespace script_test;
  REQUIRE_MODELS();
  const auto plan = shardplan::parse_plan(kGptPlan, "gpt_head_parallel.yaml");
  const torch::jit::Module original = load(dir, "gpt.pt");
  torch::manual_seed(3);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int s = 0; s < 3; ++s) batches.emplace_back(torch::randint(48, {4, 6}), torch::randint(48, {4, 6}));
  auto loss_of = [](torch::jit::Module& m, const torch::Tensor& ids, const torch::Tensor& targets) {
    torch::Tensor logits = m.forward({ids}).toTensor();
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  };
  const double max_norm = 0.05;
  Trial want;
  {
    torch::jit::Module m = load(dir, "gpt.pt");
    const auto params = params_of(m);
    auto opt = sgd(params);
    for (const auto& [x, y] : batches) {
      opt->zero_grad();
      loss_of(m, x, y).backward();
      want.norms.push_back(torch::nn::utils::clip_grad_norm_(params, max_norm));
      opt->step();
    }
    for (const auto& [name, t] : script_state_dict(m)) want.params[name] = t.clone();
  }
  std::vector<std::vector<double>> norms(2);
  Trial got;
  std::mutex mu;
  shardplan::run_ranks_in_threads(2, [&](World& w) {
    shardplan::ScriptParallel sp = shardplan::parallelize_script(original, plan, w);
    auto opt = sgd(params_of(*sp.module));
    for (const auto& [x, y] : batches) {
      opt->zero_grad();
      loss_of(*sp.module, x, y).backward();
      norms[w.rank()].push_back(shardplan::clip_grad_norm_(*sp.module, sp.report, w, max_norm));
      opt->step();
    }
    shardplan::check_replicas(*sp.module, sp.report, w);
    auto full = shardplan::collect_state_dict(script_state_dict(*sp.module), sp.report, w, 0);
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [name, t] : full) got.params[name] = t;
  });
  EXPECT_EQ(norms[0], norms[1]);
  got.norms = norms[0];
  expect_same(got, want, max_norm, "script gpt");
}

// ------------------------------------------------------------ replica check

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const shardplan::Error& e) {
    return e.what();
  }
  return "";
}

// The loop: torch's clip_grad_norm_ on each rank's shards clips the
// replicated parameters by different coefficients; the replica check
// catches it at the first check on every rank, ours passes.
std::vector<std::string> replica_errors(bool torch_clip) {
  const auto task = dp_test::mlp_task(2, 4);
  const auto plan = shardplan::parse_plan(std::string("version: 1\nmesh: {model: 2}\n") + dp_test::kMlpRules, "p.yaml");
  std::vector<std::string> errors(2);
  shardplan::run_ranks_in_threads(2, [&](World& w) {
    auto m = task.model->clone();
    const auto report = shardplan::parallelize(*m, plan, w);
    auto opt = sgd(shardplan::unique_parameters(*m));
    size_t step = 0;
    try {
      for (; step < task.batches.size(); ++step) {
        const auto& [x, y] = task.batches[step];
        opt->zero_grad();
        task.loss(*m, x, y).backward();
        if (torch_clip)
          torch::nn::utils::clip_grad_norm_(m->parameters(), 0.01);
        else
          shardplan::clip_grad_norm_(*m, report, w, 0.01);
        opt->step();
        shardplan::check_replicas(*m, report, w);
      }
    } catch (const shardplan::Error& e) {
      errors[w.rank()] = "step " + std::to_string(step) + ": " + e.what();
    }
  });
  return errors;
}

TEST(Replicas, TorchClipOnShardsIsCaughtAtTheFirstCheckOursPasses) {
  for (const std::string& e : replica_errors(true)) {
    EXPECT_EQ(e.rfind("step 0: replica check: ", 0), 0u) << e;
    EXPECT_NE(e.find("shardplan::clip_grad_norm_"), std::string::npos) << e;
    EXPECT_NE(e.find("random stream"), std::string::npos) << e;
    EXPECT_NE(e.find("non-deterministic"), std::string::npos) << e;
  }
  // fc2.bias (the first replica) and fc3 are replicated; fc1 and fc2.weight are split.
  EXPECT_NE(replica_errors(true)[0].find("parameter 'fc2.bias' differs"), std::string::npos);
  for (const std::string& e : replica_errors(false)) EXPECT_EQ(e, "");
}

// A `shared` split: the two ranks holding one kv head must agree (2 kv
// heads over 4 ranks); a change to one copy is found, naming it, and a
// change to what only one rank holds is no drift.
TEST(Replicas, SharedKvHeadsAreComparedWithinTheirSharingRanks) {
  auto model = llama_fixture::build(llama_fixture::config(2));
  const auto plan = llama_fixture::plan("llama");
  for (const char* changed : {"", "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.q_proj.weight"}) {
    std::vector<std::shared_ptr<torch::nn::Module>> models;
    for (int r = 0; r < 4; ++r) models.push_back(model->clone());
    std::vector<std::string> errors(4);
    shardplan::run_ranks_in_threads(4, [&](World& w) {
      auto& m = *models[w.rank()];
      const auto report = shardplan::parallelize(m, plan, w);
      if (w.rank() == 1 && *changed) {
        torch::NoGradGuard no_grad;
        m.named_parameters()[changed].view(-1)[0] += 1e-9;
      }
      errors[w.rank()] = error_of([&] { shardplan::check_replicas(m, report, w); });
    });
    const bool drift = std::string(changed).find("k_proj") != std::string::npos;
    for (int r = 0; r < 4; ++r) EXPECT_EQ(errors[r].empty(), !drift) << changed << " rank " << r << ": " << errors[r];
    if (drift) EXPECT_NE(errors[0].find(changed), std::string::npos) << errors[0];
  }
}

}  // namespace

}  // namespace test_clip_grad_dp
