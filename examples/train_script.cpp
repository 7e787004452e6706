// train_script: a language model exported from Python as TorchScript
// (examples/export_script_gpt.py) trained with a plan on N ranks that are
// threads (docs/TORCHSCRIPT.md), the model never rewritten in C++:
//
//   train_script --model gpt.pt --plan examples/script_gpt.yaml --ranks 2
//                [--steps 20] [--batch 8] [--lr 2e-3] [--verify] [--compare]
//
// Next-byte prediction on examples/data (cross-entropy on the gathered
// logits, Adam). --verify runs verify_script on the first batch first (a
// traced module needs it for a head-parallel plan); --compare trains the
// unsharded module on the same batches and exits 1 when a loss differs by
// more than 1e-9 (float64 modules) or 1e-4.
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "models/corpus.h"
#include "shardplan/script.h"
#include "shardplan/world.h"

namespace {

struct Args {
  std::string model, plan;
  int ranks = 2, steps = 20;
  int64_t batch = 8;
  double lr = 2e-3;
  bool verify = false, compare = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "train_script: %s\nusage: train_script --model FILE.pt --plan PLAN.yaml [--ranks N] [--steps S] "
               "[--batch B] [--lr X] [--verify] [--compare]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value for " + k);
      return argv[++i];
    };
    try {
      if (k == "--model") a.model = value();
      else if (k == "--plan") a.plan = value();
      else if (k == "--ranks") a.ranks = std::stoi(value());
      else if (k == "--steps") a.steps = std::stoi(value());
      else if (k == "--batch") a.batch = std::stoll(value());
      else if (k == "--lr") a.lr = std::stod(value());
      else if (k == "--verify") a.verify = true;
      else if (k == "--compare") a.compare = true;
      else usage("unknown argument '" + k + "'");
    } catch (const std::logic_error&) {
      usage("bad value for " + k);
    }
  }
  if (a.model.empty() || a.plan.empty()) usage("--model and --plan are required");
  if (a.ranks < 1 || a.steps < 1 || a.batch < 1) usage("--ranks, --steps and --batch must be positive");
  return a;
}

struct Batch {
  torch::Tensor input, target;
};

std::vector<Batch> batches(const Args& a, int64_t context) {
  shardplan::examples::Corpus corpus(shardplan::examples::default_corpus_path());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  std::vector<Batch> out;
  for (int s = 0; s < a.steps; ++s) {
    torch::Tensor w = corpus.windows(gen, a.batch, context + 1);
    out.push_back({w.narrow(1, 0, context), w.narrow(1, 1, context)});
  }
  return out;
}

// Each step's loss; `m` is trained in place.
std::vector<double> train(torch::jit::Module& m, const std::vector<Batch>& data, double lr) {
  std::vector<torch::Tensor> params;
  for (const auto& p : m.parameters()) params.push_back(p);
  torch::optim::Adam opt(params, torch::optim::AdamOptions(lr));
  std::vector<double> losses;
  for (const Batch& b : data) {
    opt.zero_grad();
    torch::Tensor logits = m.forward({b.input}).toTensor();
    torch::Tensor loss = torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), b.target.reshape({-1}));
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    const torch::jit::Module model = torch::jit::load(a.model);
    const shardplan::Plan plan = shardplan::load_plan(a.plan);
    const int64_t context = model.hasattr("context") ? model.attr("context").toInt() : 64;
    const auto data = batches(a, context);
    const bool float64 = model.parameters().begin().operator*().scalar_type() == torch::kDouble;
    shardplan::ScriptOptions options;
    if (a.verify) {
      auto v = std::make_shared<shardplan::ScriptVerification>(
          shardplan::verify_script(model, plan, a.ranks, {data.front().input}));
      std::printf("verify:\n%s\n", v->str().c_str());
      if (!v->passed()) return 1;
      options.verified = v;
    }
    std::vector<double> losses;
    std::mutex mu;
    shardplan::run_ranks_in_threads(a.ranks, [&](shardplan::World& world) {
      shardplan::ScriptParallel sp = shardplan::parallelize_script(model, plan, world, options);
      if (world.rank() == 0) std::printf("%s", sp.report.table().c_str());
      auto mine = train(*sp.module, data, a.lr);
      std::lock_guard<std::mutex> lock(mu);
      if (world.rank() == 0) losses = mine;
    });
    for (size_t s = 0; s < losses.size(); ++s) std::printf("step %3zu  loss %.10f\n", s + 1, losses[s]);
    if (!a.compare) return 0;
    torch::jit::Module unsharded;
    {
      torch::NoGradGuard no_grad;  // else the clone's parameters are not leaves
      unsharded = model.clone();
    }
    // A tensor cloned under the guard does not require grad: as the original.
    auto originals = model.named_parameters().begin();
    for (const auto& p : unsharded.named_parameters()) p.value.requires_grad_((*originals++).value.requires_grad());
    const auto want = train(unsharded, data, a.lr);
    double worst = 0;
    for (size_t s = 0; s < want.size(); ++s) worst = std::max(worst, std::abs(want[s] - losses[s]));
    const double tolerance = float64 ? 1e-9 : 1e-4;
    std::printf("largest loss difference to the unsharded module over %d steps: %.3g (tolerance %.0g)\n", a.steps,
                worst, tolerance);
    return worst <= tolerance ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_script: %s\n", e.what());
    return 1;
  }
}
