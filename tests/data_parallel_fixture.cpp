#include "data_parallel_fixture.h"

#include "mlp_model.h"

#include <mutex>

#include "models/gpt.h"
#include "models/model.h"
#include "shardplan/checkpoint.h"
#include "shardplan/nn/linear.h"
#include "shardplan/optimizer.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/training.h"
#include "shardplan/world.h"
#include "shardplan/zero_optimizer.h"

namespace dp_test {
namespace {

namespace ex = shardplan::examples;

using mlp_model::Mlp;
using mlp_model::MlpImpl;

}  // namespace


const char* const kMlpRules = mlp_model::kMlpRules;

const char* const kGptRules = R"(
rules:
  - match: 'tok_emb\.weight'
    layout: [model, null]
  - match: 'blocks\.\d+\.attn\.in_proj_weight'
    layout: [model, null]
  - match: 'blocks\.\d+\.attn\.in_proj_bias'
    layout: [model]
  - match: 'blocks\.\d+\.attn\.out_proj\.weight'
    layout: [null, model]
    input: sharded
  - match: 'blocks\.\d+\.fc1\.weight'
    layout: [model, null]
    output: sharded
  - match: 'blocks\.\d+\.fc1\.bias'
    layout: [model]
  - match: 'blocks\.\d+\.fc2\.weight'
    layout: [null, model]
    input: sharded
  - match: 'head\.weight'
    layout: [model, null]
    output: sharded
  - match: 'loss'
    layout: [null, model]
)";

static const ex::Overrides kGpt = {{"vocab", "32"}, {"context", "6"}, {"embed", "16"},
                            {"heads", "4"},  {"layers", "2"},  {"mlp", "24"}};


Task gpt_task(int steps, int64_t batch) {
  torch::manual_seed(3);
  Task t;
  t.model = ex::make_model("gpt", kGpt).module;
  t.model->to(torch::kDouble);
  t.loss = [](torch::nn::Module& m, const torch::Tensor& x, const torch::Tensor& y) {
    return dynamic_cast<ex::GPTImpl&>(m).loss(ex::Batch{x, y});
  };
  torch::manual_seed(11);
  for (int i = 0; i < steps; ++i)
    t.batches.emplace_back(torch::randint(32, {batch, 6}, torch::kLong), torch::randint(32, {batch, 6}, torch::kLong));
  return t;
}

Task mlp_task(int steps, int64_t batch) {
  torch::manual_seed(4);
  Task t;
  t.model = Mlp().ptr();
  t.model->to(torch::kDouble);
  t.loss = [](torch::nn::Module& m, const torch::Tensor& x, const torch::Tensor& y) {
    return dynamic_cast<MlpImpl&>(m).loss(x, y);
  };
  torch::manual_seed(12);
  for (int i = 0; i < steps; ++i)
    t.batches.emplace_back(torch::randn({batch, 6}, torch::kDouble), torch::randn({batch, 3}, torch::kDouble));
  return t;
}

std::unique_ptr<torch::optim::Optimizer> make_opt(bool adam, std::vector<torch::Tensor> params, bool adamw) {
  if (adamw) return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-2));
  if (adam) return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(5e-2).momentum(0.9));
}


RefRun reference(const Task& task, bool adam, int chunks, bool adamw) {
  auto model = task.model->clone();
  auto opt = make_opt(adam, model->parameters(), adamw);
  RefRun r;
  for (const auto& [x, y] : task.batches) {
    opt->zero_grad();
    torch::Tensor loss;
    const int64_t n = x.size(0) / chunks;
    for (int k = 0; k < chunks; ++k) {
      auto part = task.loss(*model, x.narrow(0, k * n, n), y.narrow(0, k * n, n)) / chunks;
      loss = loss.defined() ? loss + part : part;
    }
    loss.backward();
    opt->step();
    r.losses.push_back(loss.item<double>());
  }
  for (const auto& p : model->named_parameters()) r.params[p.key()] = p.value().detach().clone();
  return r;
}



// One step's forward and backward passes on this rank's slice, in
// micro-batches; returns the sum of the micro-batches' losses.
static double backward_micro_batches(const Task& task, const DpCase& c, torch::nn::Module& model, DataParallel& dp,
                              const torch::Tensor& x, const torch::Tensor& y) {
  const int64_t n = x.size(0) / c.micro;
  double local = 0;
  for (int k = 0; k < c.micro; ++k) {
    auto loss = task.loss(model, x.narrow(0, k * n, n), y.narrow(0, k * n, n)) / c.micro;
    local += loss.item<double>();
    const bool sync = c.sync == DpCase::every_syncs || (c.sync == DpCase::last_syncs && k + 1 == c.micro);
    if (!sync) {
      DataParallel::NoSync no_sync(dp);
      loss.backward();
    } else {
      loss.backward();
    }
  }
  return local;
}

std::vector<double> run_dp(const Task& task, const DpCase& c, const RefRun& ref) {
  const auto plan = shardplan::parse_plan(c.plan, "dp.yaml");
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < c.world; ++r) replicas.push_back(task.model->clone());
  std::vector<double> losses;
  std::mutex mu;
  std::map<int, double> worst;
  shardplan::StateDict full;
  for (const auto& kv : ref.params) full.emplace_back(kv.first, kv.second);
  shardplan::run_ranks_in_threads(c.world, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    shardplan::Training training = shardplan::parallelize_for_training(model, plan, w);
    const auto& report = training.report;
    DataParallel& dp = *training.data_parallel;
    const auto factory = [&](std::vector<torch::Tensor> p) { return make_opt(c.adam, p, c.adamw); };
    std::unique_ptr<shardplan::Optimizer> opt;
    std::unique_ptr<torch::optim::Optimizer> plain;
    std::unique_ptr<shardplan::ZeroOptimizer> zero;
    if (c.loop == Loop::optimizer)
      opt = std::make_unique<shardplan::Optimizer>(dp, factory);
    else if (dp.zero())
      zero = std::make_unique<shardplan::ZeroOptimizer>(dp, factory);
    else
      plain = make_opt(c.adam, model.parameters(), c.adamw);
    std::vector<double> mine;
    for (const auto& [gx, gy] : task.batches) {
      opt ? opt->zero_grad() : zero ? zero->zero_grad() : plain->zero_grad();
      const double local = backward_micro_batches(task, c, model, dp, training.local_batch(gx), training.local_batch(gy));
      if (c.loop == Loop::finish) dp.finish();
      if (opt)
        opt->step();
      else if (zero)
        zero->step();
      else
        plain->step();
      mine.push_back(training.average(local));
    }
    dp.check_replicas();
    const DataParallel::WholeParameters whole(dp);  // ZeRO-3: the parameters, not this rank's slices
    auto expected = shardplan::relocate_state_dict(full, report);
    double err = 0;
    auto params = model.named_parameters();
    for (const auto& [name, t] : expected) {
      if (!params.contains(name)) continue;
      const auto& got = params[name];
      err = std::max(err, (got - t).abs().max().item<double>() / std::max(1.0, t.abs().max().item<double>()));
    }
    std::lock_guard<std::mutex> lock(mu);
    worst[w.rank()] = err;
    if (w.rank() == 0) losses = mine;
  });
  for (const auto& [rank, err] : worst) EXPECT_LT(err, 1e-10) << "rank " << rank << " final parameters";
  return losses;
}

void expect_same_losses(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-10 * std::max(1.0, std::abs(want[i]))) << "step " << i + 1;
}

std::string plan_2d(const char* rules, const std::string& extra) {
  return std::string("version: 1\nmesh: {data: 2, model: 2}\n") + extra + rules;
}
std::string plan_dp(const std::string& extra) { return "version: 1\nmesh: {data: 4}\n" + extra + "rules: []\n"; }

}  // namespace dp_test
