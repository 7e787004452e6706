// The cost of shardplan::check_replicas and shardplan::clip_grad_norm_
// against one training step of the example GPT as train_gpt runs it by
// default (the default config, batch 16, float32, Adam) under a plan, one
// process per rank:
//
//   shardplan launch -n 2 --backend gloo -- bench_replica_check --plan plans/gpt.yaml
//
// Each round times a block of training steps (zero_grad, forward, backward,
// step), then a block of check_replicas calls and a block of clip_grad_norm_
// calls (max_norm large: the norm and the all-reduce; clipping adds one
// multiply over the gradients, as torch's does) and, for scale, torch's
// clip_grad_norm_ on the rank's own shards (the wrong norm), on the same
// process group, so machine noise hits them alike. Reported: the median over
// rounds of each per-call time on the slowest rank, the check's cost as a
// fraction of a step, and the smallest --check-replicas N that keeps it
// under 1 % of the steps it runs among (docs/BENCHMARKS.md).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "models/heap.h"
#include "models/model.h"
#include "shardplan/clip_grad.h"
#include "shardplan/count_option.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/replicas.h"
#include "shardplan/tied.h"
#include "shardplan/world.h"

namespace {

namespace ex = shardplan::examples;

struct Args {
  std::string plan = "plans/gpt.yaml";
  std::string config;  // the example GPT's defaults, as train_gpt
  int64_t batch = 16;  // train_gpt's default
  int steps = 5;       // per timed block
  int calls = 5;       // check_replicas / clip_grad_norm_ calls per timed block
  int rounds = 5;
};

[[noreturn]] void usage(const char* program, const std::string& why) {
  std::fprintf(stderr,
               "%s: %s\nusage (under `shardplan launch -n N --backend gloo --`): %s [--plan PLAN.yaml]\n"
               "       [--config KEY=VALUE,...] [--batch N] [--steps PER_BLOCK] [--calls PER_BLOCK] [--rounds N]\n",
               program, why.c_str(), program);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage(argv[0], "missing value for " + k);
    const std::string v = argv[++i];
    try {
      if (k == "--plan") a.plan = v;
      else if (k == "--config") a.config = v;
      else if (k == "--batch") a.batch = shardplan::count_option(k, v, 1, INT_MAX);
      else if (k == "--steps") a.steps = shardplan::count_option_int(k, v, 1);
      else if (k == "--calls") a.calls = shardplan::count_option_int(k, v, 1);
      else if (k == "--rounds") a.rounds = shardplan::count_option_int(k, v, 1);
      else usage(argv[0], "unknown argument '" + k + "'");
    } catch (const shardplan::CountError& e) {
      usage(argv[0], e.what());
    }
  }
  return a;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Milliseconds per call of `f` over `n` calls, the slowest rank's.
template <class F>
double timed(shardplan::World& world, int n, F&& f) {
  world.comm().barrier();
  const double t0 = now_ms();
  for (int i = 0; i < n; ++i) f();
  at::Tensor ms = at::full({1}, (now_ms() - t0) / n, at::kDouble);
  world.comm().all_reduce(ms, shardplan::ReduceOp::Max);
  return ms.item<double>();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  ex::keep_freed_heap();
  try {
    auto world = shardplan::init_world(shardplan::WorldOptions::from_env());
    torch::manual_seed(0);
    ex::ModelHandle m = ex::make_model("gpt", ex::parse_overrides(a.config));
    const auto report = shardplan::parallelize(*m.module, shardplan::load_plan(a.plan), *world);
    torch::optim::Adam opt(shardplan::unique_parameters(*m.module), torch::optim::AdamOptions(2e-3));
    // Random tokens (the same on every rank): a step's time does not depend on the text.
    const ex::GPTConfig config = ex::GPTConfig::from(ex::parse_overrides(a.config));
    torch::manual_seed(1);
    const ex::Batch batch{torch::randint(config.vocab, {a.batch, config.context}),
                          torch::randint(config.vocab, {a.batch, config.context})};
    auto step = [&] {
      opt.zero_grad();
      m.model->loss(batch).backward();
      opt.step();
    };
    step();  // warm-up: allocations, the optimizer's state
    const auto params = shardplan::unique_parameters(*m.module);
    std::vector<double> step_ms, check_ms, clip_ms, torch_ms;
    for (int r = 0; r < a.rounds; ++r) {
      step_ms.push_back(timed(*world, a.steps, step));
      check_ms.push_back(timed(*world, a.calls, [&] { shardplan::check_replicas(*m.module, report, *world); }));
      clip_ms.push_back(
          timed(*world, a.calls, [&] { shardplan::clip_grad_norm_(*m.module, report, *world, 1e30); }));
      // For scale only: torch's on this rank's shards (the wrong norm) costs the local part alone.
      torch_ms.push_back(timed(*world, a.calls, [&] { torch::nn::utils::clip_grad_norm_(params, 1e30); }));
    }
    if (world->rank() == 0) {
      const double s = median(step_ms), c = median(check_ms), k = median(clip_ms), t = median(torch_ms);
      std::printf("gpt %s, %lld parameter bytes per rank, batch %lld, %d ranks, %d rounds (median, slowest rank)\n",
                  m.model->config_str().c_str(), static_cast<long long>(report.local_bytes()),
                  static_cast<long long>(a.batch), world->size(), a.rounds);
      std::printf("training step:   %8.3f ms\n", s);
      std::printf("check_replicas:  %8.3f ms = %.2f %% of a step; under 1 %% of the steps from every N >= %d\n", c,
                  100 * c / s, static_cast<int>(std::floor(100 * c / s)) + 1);
      std::printf("clip_grad_norm_: %8.3f ms = %.2f %% of a step (torch's on this rank's shards: %.3f ms)\n", k,
                  100 * k / s, t);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_replica_check: %s\n", e.what());
    return 1;
  }
  return 0;
}
