// Cost of the framework at world size 1: a training step of the example MLP
// built from shardplan layers with plans/mlp.yaml applied, against the same
// model built from torch::nn layers. Both run interleaved in one process
// (alternating order each round) so machine noise hits them alike; the figure
// is the ratio of median step times.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "shardplan/nn/linear.h"
#include "shardplan/count_option.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace {

template <class L>
struct MLPImpl : torch::nn::Module {
  MLPImpl(int in, int hidden, int out) {
    fc1 = register_module("fc1", L(in, hidden));
    fc2 = register_module("fc2", L(hidden, hidden));
    fc3 = register_module("fc3", L(hidden, out));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3->forward(torch::relu(fc2->forward(torch::relu(fc1->forward(x)))));
  }
  L fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

struct Runner {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::unique_ptr<torch::optim::Adam> opt;
  void step(const torch::Tensor& x, const torch::Tensor& y) {
    opt->zero_grad();
    torch::mse_loss(forward(x), y).backward();
    opt->step();
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string plan_path = argc > 1 ? argv[1] : "plans/mlp.yaml";
  const int rounds = argc > 2 ? static_cast<int>(shardplan::count_or_exit(argv[0], "ROUNDS", argv[2], 1, INT_MAX)) : 40;
  struct Shape { int batch, in, hidden, out; };
  std::vector<Shape> shapes = {{64, 32, 256, 8}, {256, 256, 1024, 64}};

  shardplan::WorldOptions wo;
  wo.backend = "local";
  wo.backend_options = {"local_id=bench_mlp_step"};
  auto world = shardplan::init_world(wo);
  auto plan = shardplan::load_plan(plan_path);

  std::printf("MLP training step (Adam), world size 1, %s applied vs torch::nn; median of %d interleaved rounds\n",
              plan_path.c_str(), rounds);
  std::printf("%-28s %14s %14s %8s\n", "batch x in-hidden-out", "torch::nn us", "shardplan us", "ratio");
  for (const auto& s : shapes) {
    torch::manual_seed(0);
    auto ref = std::make_shared<MLPImpl<torch::nn::Linear>>(s.in, s.hidden, s.out);
    torch::manual_seed(0);
    auto ours = std::make_shared<MLPImpl<shardplan::nn::Linear>>(s.in, s.hidden, s.out);
    shardplan::parallelize(*ours, plan, *world);
    Runner a{ref, [ref](const torch::Tensor& x) { return ref->forward(x); },
             std::make_unique<torch::optim::Adam>(ref->parameters())};
    Runner b{ours, [ours](const torch::Tensor& x) { return ours->forward(x); },
             std::make_unique<torch::optim::Adam>(ours->parameters())};
    auto x = torch::randn({s.batch, s.in});
    auto y = torch::randn({s.batch, s.out});
    const int steps = s.hidden >= 1024 ? 5 : 50;
    for (int i = 0; i < 20; ++i) {
      a.step(x, y);
      b.step(x, y);
    }
    std::vector<double> ta, tb;
    for (int r = 0; r < rounds; ++r) {
      for (int k = 0; k < 2; ++k) {
        Runner& run = ((r + k) % 2 == 0) ? a : b;
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < steps; ++i) run.step(x, y);
        double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / steps;
        (&run == &a ? ta : tb).push_back(us);
      }
    }
    char label[64];
    std::snprintf(label, sizeof label, "%d x %d-%d-%d", s.batch, s.in, s.hidden, s.out);
    double ma = median(ta), mb = median(tb);
    std::printf("%-28s %14.1f %14.1f %8.3f\n", label, ma, mb, mb / ma);
  }
  return 0;
}
