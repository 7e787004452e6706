// What a rank holds of the example GPT's training state (float32 Adam) and
// what it moves on the data axis per step, under ZeRO stages 1 and 2 at
// {data: 2, model: 2} (plans/gpt_2d.yaml with `zero: S`), ranks as threads:
//
//   bench_zero_memory [--config embed=256,...] [--batch 8] [--bucket-mb 1] [--stages 1,2] [--check 1]
//
// Memory: shardplan::state_bytes (live storages, each once: parameters,
// every gradient buffer, the optimizer's moments, any copy of the
// parameters the optimizer steps), the largest over ranks, after backward
// and after the step of the second step (the moments exist), per parameter
// of the unsharded model. Theory with N parameters, T = model size, D =
// data size: ZeRO-1 4/T + 4/T + 8/(T D), ZeRO-2 4/T + 4/(T D) + 8/(T D),
// ZeRO-3 16/(T D) bytes per parameter (the model's replicated parameters,
// LayerNorms and a few biases, and each bucket's padding make the rest).
// Traffic: the bytes each rank hands to the data axis' collectives
// (Communicator stats of that group) during backward (reduce-scatters,
// plus the used-parameter flags) and during the step (all-gathers), as a
// ring moves them per rank: (D-1)/D of a reduce-scatter's input, D-1 times
// an all-gather's; theory 2 (D-1)/D x the parameter bytes this rank holds
// (its TP shards and the replicated parameters: what its buckets hold).
// --check 1 fails unless both are within 5 % and 1 %.
#include <torch/torch.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "models/model.h"
#include "shardplan/count_option.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/optimizer.h"
#include "shardplan/plan.h"
#include "shardplan/state_bytes.h"
#include "shardplan/training.h"
#include "shardplan/world.h"

namespace {

namespace ex = shardplan::examples;

struct Args {
  std::string config = "context=64,embed=256,heads=8,layers=4,mlp=1024";
  int64_t batch = 8;
  std::string bucket_mb = "1";
  std::vector<int> stages = {1, 2};
  bool check = false;
};

[[noreturn]] void usage(const char* prog, const std::string& why) {
  std::fprintf(stderr,
               "bench_zero_memory: error: %s\nusage: %s [--config K=V,...] [--batch N] [--bucket-mb X] "
               "[--stages 1,2] [--check 1]\n",
               why.c_str(), prog);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage(argv[0], k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--config") {
      a.config = v;
    } else if (k == "--batch") {
      a.batch = shardplan::count_or_exit(argv[0], k, v, 1, INT_MAX);
    } else if (k == "--bucket-mb") {
      a.bucket_mb = v;
    } else if (k == "--check") {
      a.check = shardplan::count_or_exit(argv[0], k, v, 0, 1) == 1;
    } else if (k == "--stages") {
      a.stages.clear();
      std::stringstream s(v);
      std::string item;
      while (std::getline(s, item, ','))
        a.stages.push_back(static_cast<int>(shardplan::count_or_exit(argv[0], k, item, 1, 3)));
    } else {
      usage(argv[0], "unknown argument '" + k + "'");
    }
  }
  return a;
}

std::string plan_text(const std::string& bucket_mb, int stage) {
  std::ifstream in(SHARDPLAN_SOURCE_DIR "/plans/gpt_2d.yaml");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "data_parallel: {bucket_mb: 25}";
  const auto at = text.find(key);
  if (at == std::string::npos) throw shardplan::Error("plans/gpt_2d.yaml has no '" + key + "'");
  return text.replace(at, key.size(),
                      "data_parallel: {bucket_mb: " + bucket_mb + ", zero: " + std::to_string(stage) + "}");
}

struct Measured {
  shardplan::StateBytes after_backward, after_step;  // the largest total over ranks
  int64_t peak_grads = 0;                            // during backward, the largest over ranks
  double wire = 0;                                   // ring bytes per rank per step, the largest
  double wire_params = 0;                            // that rank's parameter bytes
  int64_t wire_formula = 0;                          // DataParallel::wire_bytes()
};

void keep_larger(shardplan::StateBytes& kept, const shardplan::StateBytes& s) {
  if (s.total() > kept.total()) kept = s;
}

Measured measure(const ex::ModelHandle& ref, const shardplan::Plan& plan, const std::vector<ex::Batch>& batches) {
  std::vector<ex::ModelHandle> replicas;
  for (int r = 0; r < 4; ++r) replicas.push_back(ex::as_example(ref.module->clone()));
  Measured m;
  std::mutex mu;
  shardplan::run_ranks_in_threads(4, [&](shardplan::World& w) {
    ex::ModelHandle& h = replicas[static_cast<size_t>(w.rank())];
    shardplan::Training t = shardplan::parallelize_for_training(*h.module, plan, w);
    shardplan::DataParallel& dp = *t.data_parallel;
    shardplan::Optimizer opt(dp, [](std::vector<at::Tensor> p) {
      return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-3));
    });
    shardplan::StateBytes back, step;
    double wire = 0;
    // Gradient bytes as each gradient arrives (after DataParallel's own
    // hook, registered first, has put the last one in its bucket).
    int64_t peak = 0;
    for (auto& p : h.module->parameters())
      if (p.requires_grad())
        p.register_hook([&](const at::Tensor&) { peak = std::max(peak, shardplan::state_bytes(opt).grads); });
    const double d = dp.size();
    for (const auto& b : batches) {
      opt.zero_grad();
      dp.group()->reset_stats();
      h.model->loss({t.local_batch(b.input), t.local_batch(b.target)}).backward();
      const double scattered = static_cast<double>(dp.group()->stats().bytes);
      back = shardplan::state_bytes(opt);
      dp.group()->reset_stats();
      opt.step();
      const double gathered = static_cast<double>(dp.group()->stats().bytes);
      step = shardplan::state_bytes(opt);
      wire = scattered * (d - 1) / d + gathered * (d - 1);
    }
    std::lock_guard<std::mutex> lock(mu);
    keep_larger(m.after_backward, back);
    keep_larger(m.after_step, step);
    if (wire > m.wire) {
      m.wire = wire;
      m.wire_params = static_cast<double>(step.params);
    }
    m.wire_formula = std::max(m.wire_formula, dp.wire_bytes());
    m.peak_grads = std::max(m.peak_grads, peak);
  });
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    torch::manual_seed(1);
    const ex::ModelHandle ref = ex::make_model("gpt", ex::parse_overrides(a.config));
    int64_t n = 0;
    for (const auto& p : ref.module->parameters()) n += p.numel();
    std::vector<ex::Batch> batches;
    const auto* lm = dynamic_cast<const ex::CausalLM*>(ref.model);
    if (!lm) throw shardplan::Error("the example GPT is no CausalLM");
    torch::manual_seed(2);
    for (int s = 0; s < 2; ++s)
      batches.push_back({torch::randint(lm->vocab_size(), {a.batch, lm->context_size()}, torch::kLong),
                         torch::randint(lm->vocab_size(), {a.batch, lm->context_size()}, torch::kLong)});
    const double t = 2, d = 2;
    std::printf("model gpt: %s; %lld parameters; float32 Adam; {data: 2, model: 2}; bucket_mb %s\n",
                a.config.c_str(), static_cast<long long>(n), a.bucket_mb.c_str());
    std::printf("%-6s %10s %10s %10s %10s %10s %10s %8s %14s %14s %8s\n", "stage", "params/N", "grads/N", "optim/N",
                "copies/N", "total/N", "theory/N", "ratio", "wire B/step", "theory B/step", "ratio");
    std::vector<std::string> off;
    for (int stage : a.stages) {
      const shardplan::Plan plan = shardplan::parse_plan(plan_text(a.bucket_mb, stage), "gpt_2d_zero.yaml");
      const Measured m = measure(ref, plan, batches);
      const double theory = stage == 1 ? 4 / t + 4 / t + 8 / (t * d)
                            : stage == 2 ? 4 / t + 4 / (t * d) + 8 / (t * d)
                                         : 16 / (t * d);
      const double wire_theory = (stage == 3 ? 3 : 2) * (d - 1) / d * m.wire_params;
      for (const auto* s : {&m.after_backward, &m.after_step}) {
        const double total = static_cast<double>(s->total()) / static_cast<double>(n);
        const bool first = s == &m.after_backward;
        std::printf("%-6s %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %8.4f", (std::to_string(stage) + (first ? "b" : "s")).c_str(),
                    s->params / double(n), s->grads / double(n), s->optimizer / double(n), s->copies / double(n),
                    total, theory, total / theory);
        if (first)
          std::printf(" %14.0f %14.0f %8.4f\n", m.wire, wire_theory, m.wire / wire_theory);
        else
          std::printf("\n");
        if (std::abs(total / theory - 1) > 0.05)
          off.push_back("ZeRO-" + std::to_string(stage) + (first ? " after backward" : " after the step") +
                        ": " + std::to_string(total) + " bytes per parameter, theory " + std::to_string(theory));
      }
      std::printf("%-6s peak gradient bytes during backward %.3f/N (the slices and the buckets still reducing)\n",
                  std::to_string(stage).c_str(), static_cast<double>(m.peak_grads) / static_cast<double>(n));
      if (std::abs(m.wire / wire_theory - 1) > 0.01)
        off.push_back("ZeRO-" + std::to_string(stage) + ": " + std::to_string(m.wire) + " bytes per step, theory " +
                      std::to_string(wire_theory));
    }
    std::printf("(rows: b = after backward, s = after the step; /N: bytes per parameter of the unsharded model)\n");
    for (const auto& o : off) std::printf("off target: %s\n", o.c_str());
    return a.check && !off.empty() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_zero_memory: error: %s\n", e.what());
    return 1;
  }
}
