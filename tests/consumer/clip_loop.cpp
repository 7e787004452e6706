// The issue's loop against an installed shardplan, one process per rank
// (`shardplan launch -n 2 --backend gloo -- consumer_clip_loop`): the README's
// plan (fc1 column-parallel, fc2 row-parallel) with a replicated LayerNorm,
// float64, clipping every step. With torch::nn::utils::clip_grad_norm_ on the
// shards each rank clips by its own norm and the replica check must stop the
// run at its first check (step 0); with shardplan::clip_grad_norm_ it passes
// and every step's norm equals torch's on the unsharded model (1e-12).
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "shardplan/clip_grad.h"
#include "shardplan/error.h"
#include "shardplan/nn/layer_norm.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/replicas.h"
#include "shardplan/world.h"

struct NetImpl : torch::nn::Cloneable<NetImpl> {
  NetImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", shardplan::nn::Linear(6, 16));
    fc2 = register_module("fc2", shardplan::nn::Linear(16, 6));
    ln = register_module("ln", shardplan::nn::LayerNorm(std::vector<int64_t>{6}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return ln(fc2(torch::relu(fc1(x)))); }
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr};
  shardplan::nn::LayerNorm ln{nullptr};
};
TORCH_MODULE(Net);

const char* kPlan = R"(mesh: {model: auto}
rules:
  - {match: 'fc1\.weight', layout: [model, null], output: sharded}
  - {match: 'fc1\.bias', layout: [model]}
  - {match: 'fc2\.weight', layout: [null, model], input: sharded}
)";

constexpr int kSteps = 3;
constexpr double kMaxNorm = 0.1;

Net clone(const Net& net) { return std::dynamic_pointer_cast<NetImpl>(net->clone()); }

torch::Tensor loss_of(Net& net, int step) {
  torch::manual_seed(100 + step);  // the same batch on every rank and in the reference
  const auto x = torch::randn({8, 6}, torch::kDouble), y = torch::randn({8, 6}, torch::kDouble);
  return torch::mse_loss(net->forward(x), y) * 1000;
}

// The step whose replica check failed (-1: none); each step's norm.
int train(const Net& init, bool ours, shardplan::World& world, std::vector<double>& norms) {
  Net net = clone(init);
  const auto report = shardplan::parallelize(*net, shardplan::parse_plan(kPlan), world);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    loss_of(net, step).backward();
    norms.push_back(ours ? shardplan::clip_grad_norm_(*net, report, world, kMaxNorm)
                         : torch::nn::utils::clip_grad_norm_(net->parameters(), kMaxNorm));
    opt.step();
    try {
      shardplan::check_replicas(*net, report, world);
    } catch (const shardplan::Error& e) {
      std::cout << "consumer clip_loop rank " << world.rank() << ": caught at step " << step << ": " << e.what()
                << "\n";
      return step;
    }
  }
  return -1;
}

int main() {
  auto world = shardplan::init_world(shardplan::WorldOptions::from_env());
  torch::manual_seed(0);
  Net init;
  init->to(torch::kDouble);
  std::vector<double> want;
  {
    Net one = clone(init);
    torch::optim::SGD opt(one->parameters(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad();
      loss_of(one, step).backward();
      want.push_back(torch::nn::utils::clip_grad_norm_(one->parameters(), kMaxNorm));
      opt.step();
    }
  }
  std::vector<double> torch_norms, our_norms;
  const int torch_caught = train(init, false, *world, torch_norms);
  const int ours_caught = train(init, true, *world, our_norms);
  double worst = 0;
  for (int s = 0; s < kSteps; ++s) worst = std::max(worst, std::abs(our_norms[s] - want[s]) / want[s]);
  const bool ok = world->size() == 2 && torch_caught == 0 && ours_caught == -1 && worst < 1e-12 && want[0] > kMaxNorm;
  std::cout << "consumer clip_loop rank " << world->rank() << " of " << world->size()
            << ": torch's clip_grad_norm_ on shards caught at step " << torch_caught << " (norm " << torch_norms[0]
            << "), shardplan::clip_grad_norm_ " << (ours_caught < 0 ? "passed" : "caught")
            << ", its norms off the unsharded " << want[0] << " by " << worst << (ok ? " ok" : " FAILED") << "\n";
  return ok ? 0 : 1;
}
