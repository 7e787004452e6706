#pragma once
// Shared by the data-parallel tests (test_data_parallel*.cpp): models with
// their losses and batches, one process's training on the global batch, and
// the same training on thread ranks under a plan, checked against it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/data_parallel.h"

namespace dp_test {

using shardplan::DataParallel;

// Rules for the MLP (fc1 column-parallel, fc2 row-parallel) and for the
// example GPT, without their mesh (plan_2d adds it).
extern const char* const kMlpRules;
extern const char* const kGptRules;

// A model, its loss on a batch (input, target), and batches for every step.
struct Task {
  std::shared_ptr<torch::nn::Module> model;
  std::function<torch::Tensor(torch::nn::Module&, const torch::Tensor&, const torch::Tensor&)> loss;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
};

Task gpt_task(int steps, int64_t batch);   // the example GPT, float64
Task mlp_task(int steps, int64_t batch);   // a 3-layer MLP, float64

// Adam (or AdamW) at 1e-2, else SGD with momentum.
std::unique_ptr<torch::optim::Optimizer> make_opt(bool adam, std::vector<torch::Tensor> params, bool adamw = false);

struct RefRun {
  std::vector<double> losses;
  std::map<std::string, torch::Tensor> params;  // whole tensors
};

// One process, the whole batch, no plan. With `chunks` > 1 the loss is the
// mean of the losses of that many equal slices of the batch, for models whose
// loss on a slice is not the slice's share of the whole batch's (a branch
// taken per slice, as data-parallel ranks and micro-batches take it).
RefRun reference(const Task& task, bool adam, int chunks = 1, bool adamw = false);

// How the loop steps: DataParallel::finish() then a torch optimizer or a
// ZeroOptimizer (round 2's loop); a shardplan::Optimizer with no finish()
// (PyTorch DDP's loop, from parallelize_for_training); or round 2's loop
// with finish() forgotten (the end of backward averages).
enum class Loop { finish, optimizer, forgotten_finish };

struct DpCase {
  std::string plan;  // YAML
  bool adam = true;
  int micro = 1;     // micro-batches per step (gradient accumulation)
  int world = 4;
  bool adamw = false;
  Loop loop = Loop::finish;
  // Micro-batches: every backward but the last under NoSync (the default),
  // none (each backward its own reduction round), or all (the step must
  // complete the round; Loop::optimizer only).
  enum { last_syncs, every_syncs, none_syncs } sync = last_syncs;
};

// The same training on thread ranks: each rank its slice of each global
// batch, in micro-batches, gradients synchronised by DataParallel. Checks
// every rank's parameters against `ref` cut to its shards, the replicas
// with check_replicas, and returns rank 0's losses (global means).
std::vector<double> run_dp(const Task& task, const DpCase& c, const RefRun& ref);

void expect_same_losses(const std::vector<double>& got, const std::vector<double>& want);  // 1e-10

// A plan on {data: 2, model: 2} with `rules`, and one on {data: 4} without
// rules; `extra` goes before the rules (data_parallel keys).
std::string plan_2d(const char* rules, const std::string& extra = "");
std::string plan_dp(const std::string& extra = "");

}  // namespace dp_test
