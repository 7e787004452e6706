// README's data-parallel loop against an installed shardplan: an MLP on
// {data: 2, model: 2} (4 thread ranks), plain and ZeRO-1, stepped by
// shardplan::Optimizer with no finish(), and round 2's loop with a torch
// optimizer and finish() forgotten; every rank's parameters after 5 Adam
// steps must equal one process's on the global batch (float64, 1e-10).
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <map>
#include <mutex>

#include "shardplan/checkpoint.h"
#include "shardplan/nn/linear.h"
#include "shardplan/optimizer.h"
#include "shardplan/plan.h"
#include "shardplan/training.h"
#include "shardplan/world.h"

struct NetImpl : torch::nn::Cloneable<NetImpl> {
  NetImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", shardplan::nn::Linear(6, 16));
    fc2 = register_module("fc2", shardplan::nn::Linear(16, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::relu(fc1->forward(x))); }
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

const char* kPlan = R"(mesh: {data: 2, model: 2}
rules:
  - {match: 'fc1\.weight', layout: [model, null], output: sharded}
  - {match: 'fc1\.bias', layout: [model]}
  - {match: 'fc2\.weight', layout: [null, model], input: sharded}
)";

using Batches = std::vector<std::pair<torch::Tensor, torch::Tensor>>;

std::unique_ptr<torch::optim::Optimizer> adam(std::vector<at::Tensor> p) {
  return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2));
}

// The README's loop (with_optimizer), or a torch optimizer and no finish().
void train(Net& model, const std::string& plan_text, bool with_optimizer, const Batches& batches,
           shardplan::World& world, shardplan::StateDict& expected_out) {
  auto t = shardplan::parallelize_for_training(*model, shardplan::parse_plan(plan_text), world);
  std::unique_ptr<shardplan::Optimizer> opt;
  std::unique_ptr<torch::optim::Optimizer> plain;
  if (with_optimizer)
    opt = std::make_unique<shardplan::Optimizer>(*t.data_parallel, adam);
  else
    plain = adam(model->parameters());
  for (auto& [x, y] : batches) {
    opt ? opt->zero_grad() : plain->zero_grad();
    auto loss = torch::mse_loss(model->forward(t.local_batch(x)), t.local_batch(y));
    loss.backward();
    if (opt)
      opt->step();
    else
      plain->step();
  }
  expected_out = shardplan::relocate_state_dict(expected_out, t.report);
}

int main() {
  torch::manual_seed(0);
  Net reference;
  reference->to(torch::kDouble);
  Batches batches;
  for (int i = 0; i < 5; ++i)
    batches.emplace_back(torch::randn({8, 6}, torch::kDouble), torch::randn({8, 3}, torch::kDouble));
  Net one = std::dynamic_pointer_cast<NetImpl>(reference->clone());
  auto opt = adam(one->parameters());
  for (auto& [x, y] : batches) {
    opt->zero_grad();
    torch::mse_loss(one->forward(x), y).backward();
    opt->step();
  }
  shardplan::StateDict full;
  for (const auto& p : one->named_parameters()) full.emplace_back(p.key(), p.value().detach());

  struct Case {
    std::string name, plan;
    bool with_optimizer;
  };
  const Case cases[] = {{"README loop", kPlan, true},
                        {"README loop, ZeRO-1", std::string(kPlan) + "data_parallel: {zero: true}\n", true},
                        {"finish() forgotten", kPlan, false}};
  int failures = 0;
  for (const Case& c : cases) {
    std::mutex mu;
    double worst = 0;
    shardplan::run_ranks_in_threads(4, [&](shardplan::World& world) {
      Net model = std::dynamic_pointer_cast<NetImpl>(reference->clone());
      shardplan::StateDict expected = full;
      train(model, c.plan, c.with_optimizer, batches, world, expected);
      auto params = model->named_parameters();
      double err = 0;
      for (const auto& [name, want] : expected) err = std::max(err, (params[name] - want).abs().max().item<double>());
      std::lock_guard<std::mutex> lock(mu);
      worst = std::max(worst, err);
    });
    const bool ok = worst < 1e-10;
    failures += !ok;
    std::cout << "consumer ddp_loop: " << c.name << ": max difference from one process " << worst
              << (ok ? " ok" : " FAILED") << "\n";
  }
  return failures ? 1 : 0;
}
