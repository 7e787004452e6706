// Tensor-parallel training of a small MLP regression model.
//
//   train_mlp --plan plans/mlp.yaml --ranks 2        ranks as threads (local backend)
//   shardplan launch -n 2 --backend gloo -- train_mlp --plan plans/mlp.yaml
//   train_mlp                                         one rank, unsharded
//
// Every rank builds the same model from the same seed; the plan then keeps
// only this rank's shard of each planned weight. Losses match the unsharded
// run step by step.
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <string>

#include "models/options.h"
#include "shardplan/auto_plan.h"
#include "shardplan/clip_grad.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/replicas.h"
#include "shardplan/world.h"

namespace {

struct Args {
  std::string plan;
  int ranks = 0;  // 0: from the launcher's environment, else 1
  int steps = 30;
  int batch = 64;
  int in = 32, hidden = 256, out = 8;
  double lr = 1e-2;
  std::string optimizer = "adam";
  std::string dtype = "float32";
  uint64_t seed = 0;
  int threads = 0;  // 0: SHARDPLAN_NUM_THREADS, else the cores shared out among this machine's ranks
  bool report = false;
  double clip = 0;             // --clip X (0: none), shardplan::clip_grad_norm_
  bool clip_with_torch = false;  // --clip-with torch: torch's over this rank's parameters
  int check_replicas = 10;     // the replica check every N steps (0: never)
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "train_mlp: %s\nusage: train_mlp [--plan PLAN.yaml|auto] [--ranks N] [--steps N] [--batch N] [--in N]\n"
               "                 [--hidden N] [--out N] [--lr X] [--optimizer sgd|adam] [--dtype float32|float64]\n"
               "                 [--seed N] [--threads N] [--report] [--clip X [--clip-with shardplan|torch]]\n"
               "                 [--check-replicas N]\n"
               "--clip X scales the gradients to a total norm of at most X (the unsharded model's norm,\n"
               "shardplan::clip_grad_norm_) and prints it; --clip-with torch uses torch's clip_grad_norm_ on\n"
               "this rank's own parameters (one process only: on shards the replicas drift); --check-replicas N\n"
               "compares the replicated parameters across the ranks every N steps (default 10; 0: never)\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  using shardplan::examples::option_double;
  using shardplan::count_option_int;
  Args a;
  std::string clip_with;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i], v;
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value for " + k);
      return v = argv[++i];
    };
    try {
      if (k == "--plan") a.plan = value();
      else if (k == "--ranks") a.ranks = count_option_int(k, value(), 0, 4096);
      else if (k == "--steps") a.steps = count_option_int(k, value(), 0);
      else if (k == "--batch") a.batch = count_option_int(k, value(), 0);
      else if (k == "--in") a.in = count_option_int(k, value(), 0);
      else if (k == "--hidden") a.hidden = count_option_int(k, value(), 0);
      else if (k == "--out") a.out = count_option_int(k, value(), 0);
      else if (k == "--lr") a.lr = option_double(value());
      else if (k == "--optimizer") a.optimizer = value();
      else if (k == "--dtype") a.dtype = value();
      else if (k == "--seed") a.seed = shardplan::examples::option_seed(value());
      else if (k == "--threads") a.threads = count_option_int(k, value(), 0, 4096);
      else if (k == "--report") a.report = true;
      else if (k == "--clip") a.clip = shardplan::examples::clip_option(value());
      else if (k == "--clip-with") clip_with = value();
      else if (k == "--check-replicas") a.check_replicas = count_option_int(k, value(), 0);
      else if (k == "--help" || k == "-h") usage("tensor-parallel MLP example");
      else usage("unknown argument '" + k + "'");
    } catch (const shardplan::CountError& e) {
      usage(e.what());
    } catch (const std::logic_error&) {  // not wholly a number, or out of range
      usage("bad value for " + k + ": '" + v + "'");
    }
  }
  if (a.optimizer != "adam" && a.optimizer != "sgd") usage("--optimizer must be sgd or adam");
  if (a.dtype != "float32" && a.dtype != "float64") usage("--dtype must be float32 or float64");
  if (a.threads < 0 || a.ranks < 0) usage("--threads and --ranks must not be negative");
  if (a.steps < 1 || a.batch < 1 || a.in < 1 || a.hidden < 1 || a.out < 1)
    usage("--steps, --batch, --in, --hidden and --out must be at least 1");
  if (!(a.lr > 0)) usage("--lr must be a positive number");
  if (!clip_with.empty() && clip_with != "shardplan" && clip_with != "torch")
    usage("--clip-with takes shardplan or torch, got '" + clip_with + "'");
  if (!clip_with.empty() && a.clip == 0) usage("--clip-with takes effect with --clip X only");
  a.clip_with_torch = clip_with == "torch";
  return a;
}

struct MLPImpl : torch::nn::Module {
  MLPImpl(int in, int hidden, int out) {
    fc1 = register_module("fc1", shardplan::nn::Linear(in, hidden));
    fc2 = register_module("fc2", shardplan::nn::Linear(hidden, hidden));
    fc3 = register_module("fc3", shardplan::nn::Linear(hidden, out));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3->forward(torch::relu(fc2->forward(torch::relu(fc1->forward(x)))));
  }
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(MLP);

// Ranks that are threads share torch's global generator: build models one at
// a time from the same seed so every rank starts from the same weights.
std::mutex init_mutex;

// The model, sharded by --plan (auto: shardplan::auto_plan); `report` is
// empty when unsharded.
MLP build(const Args& a, shardplan::World& world, shardplan::ParallelReport& report) {
  MLP model{nullptr};
  {
    std::lock_guard<std::mutex> lock(init_mutex);
    torch::manual_seed(a.seed);
    model = MLP(a.in, a.hidden, a.out);
  }
  model->to(a.dtype == "float64" ? torch::kDouble : torch::kFloat);
  if (a.plan == "auto") {
    // Planned by shardplan::auto_plan from one probe forward; the values of
    // the probe's input do not matter, only which layer feeds which.
    shardplan::AutoPlanOptions options;
    options.probe = [&](torch::nn::Module&) { return model->forward(torch::zeros({2, a.in}, model->fc1->weight.options())); };
    report = shardplan::parallelize(*model, world, options);
  } else if (!a.plan.empty()) {
    report = shardplan::parallelize(*model, shardplan::load_plan(a.plan), world);
  }
  if (!a.plan.empty() && a.report && world.rank() == 0) std::cout << (a.plan == "auto" ? report.plan_yaml : "") << report.table() << std::flush;
  return model;
}

// --clip after backward: the unsharded model's gradient norm, every element
// once; torch's over this rank's parameters with --clip-with torch (or
// unsharded, where the two agree).
double clip(const Args& a, MLP& model, const shardplan::ParallelReport& report, shardplan::World& world) {
  if (a.clip_with_torch || a.plan.empty()) return torch::nn::utils::clip_grad_norm_(model->parameters(), a.clip);
  return shardplan::clip_grad_norm_(*model, report, world, a.clip);
}

// Each rank's parameter bytes and communication, in rank order.
void print_totals(const Args& a, MLP& model, const shardplan::ParallelReport& report, shardplan::World& world) {
  int64_t local = 0, global = 0;
  for (const auto& p : model->parameters()) local += p.numel() * p.element_size();
  global = a.plan.empty() ? local : report.global_bytes();
  auto stats = world.total_stats();
  for (int r = 0; r < world.size(); ++r) {
    if (r == world.rank()) {
      std::printf("rank %d: parameter bytes %lld of %lld (%.1f%%), communicated %llu bytes in %llu calls (%llu per step)\n",
                  r, static_cast<long long>(local), static_cast<long long>(global), 100.0 * local / global,
                  static_cast<unsigned long long>(stats.bytes), static_cast<unsigned long long>(stats.calls),
                  static_cast<unsigned long long>(stats.bytes / a.steps));
      std::fflush(stdout);
    }
    world.comm().barrier();
  }
}

void train(const Args& a, shardplan::World& world, int ranks_in_process) {
  if (a.threads > 0) shardplan::set_num_threads(a.threads, world.options().local_world_size, ranks_in_process);
  const auto dtype = a.dtype == "float64" ? torch::kDouble : torch::kFloat;
  shardplan::ParallelReport report;
  MLP model = build(a, world, report);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (a.optimizer == "adam") opt = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(a.lr));
  else opt = std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(a.lr).momentum(0.9));

  // Synthetic task: a fixed random teacher network; same stream on every rank.
  // Drawn in float64 whatever the dtype (randn draws other numbers for
  // float32), so float32 and float64 runs train on the same data.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(a.seed + 1);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  auto w1 = at::randn({a.in, 64}, gen, opts) / std::sqrt(double(a.in));
  auto w2 = at::randn({64, a.out}, gen, opts) / 8.0;

  world.reset_stats();
  for (int step = 1; step <= a.steps; ++step) {
    auto x = at::randn({a.batch, a.in}, gen, opts);
    auto y = torch::tanh(x.mm(w1)).mm(w2).to(dtype);
    x = x.to(dtype);
    opt->zero_grad();
    auto loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    const double norm = a.clip > 0 ? clip(a, model, report, world) : 0;
    opt->step();
    if (a.check_replicas > 0 && !a.plan.empty() && step % a.check_replicas == 0)
      shardplan::check_replicas(*model, report, world);
    // float64 runs are compared with an unsharded run to 1e-10 and better.
    if (world.rank() == 0) std::printf("step %3d  loss %.*e", step, dtype == torch::kDouble ? 12 : 8, loss.item<double>());
    if (world.rank() == 0) std::printf(a.clip > 0 ? "  norm %.12e\n" : "\n", norm);
  }
  std::fflush(stdout);
  print_totals(a, model, report, world);
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  try {
    if (a.ranks > 0 && shardplan::WorldOptions::env_has_job())
      usage("--ranks runs ranks as threads; do not combine it with a launcher");
    if (shardplan::WorldOptions::env_has_job()) {
      auto world = shardplan::init_world(shardplan::WorldOptions::from_env());
      train(a, *world, 1);
    } else {
      const int ranks = a.ranks > 0 ? a.ranks : 1;
      shardplan::run_ranks_in_threads(ranks, [&](shardplan::World& w) { train(a, w, ranks); });
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
