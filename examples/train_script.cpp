// train_script: a language model exported from Python as TorchScript
// (examples/export_script_gpt.py, examples/export_script_llama.py) trained
// with a plan, the model never rewritten in C++ (docs/TORCHSCRIPT.md):
//
//   train_script --model gpt.pt --plan examples/script_gpt.yaml --ranks 2     ranks as threads
//   shardplan launch -n 2 --backend gloo -- train_script --model gpt.pt --plan examples/script_gpt.yaml
//                [--steps 20] [--batch 8] [--lr 2e-3] [--verify] [--compare]
//                [--generate N [--prompt TEXT]] [--clip X [--clip-with shardplan|torch]]
//                [--check-replicas N]
//
// Next-byte prediction on examples/data (cross-entropy on the gathered
// logits, Adam), then --generate N greedy bytes after --prompt through the
// sharded module (script_generate.h). --verify runs verify_script on the
// first batch first (a traced module needs it for a head-parallel plan);
// --compare trains the unsharded module on the same batches (rank 0's
// process, under a launcher) and exits 1 when a loss differs by more than
// 1e-9 (float64 modules) or 1e-4, or the generated text or the logits it
// was picked from differ. --clip X clips the gradients to a total norm of
// X (shardplan::clip_grad_norm_ over the sharded module; torch's over the
// unsharded one of --compare, whose norms must then agree too) and prints
// the norm; --check-replicas N (default 10; 0: never) compares the
// replicated parameters across the ranks every N steps.
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "models/corpus.h"
#include "models/generate.h"
#include "models/options.h"
#include "models/ranks.h"
#include "script_generate.h"
#include "shardplan/clip_grad.h"
#include "shardplan/error.h"
#include "shardplan/replicas.h"
#include "shardplan/script.h"
#include "shardplan/world.h"

namespace {

using shardplan::examples::printable;

struct Args {
  std::string model, plan;
  std::string prompt = "From fairest creatures";  // the sonnets' first line, begun
  int ranks = 2, steps = 20, generate = 0;
  int64_t batch = 8;
  double lr = 2e-3;
  bool verify = false, compare = false;
  double clip = 0;  // --clip X (0: none)
  bool clip_with_torch = false;
  int check_replicas = 10;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "train_script: %s\nusage: train_script --model FILE.pt --plan PLAN.yaml [--ranks N] [--steps S] "
               "[--batch B] [--lr X] [--verify] [--compare] [--generate N [--prompt TEXT]]\n"
               "       [--clip X [--clip-with shardplan|torch]] [--check-replicas N]\n"
               "  --ranks N runs N ranks as threads (default 2); under `shardplan launch` each process is one\n"
               "  rank and --ranks is refused\n"
               "  --clip X scales the gradients to a total norm of at most X (the unsharded model's,\n"
               "  shardplan::clip_grad_norm_) and prints it; --clip-with torch: torch's clip_grad_norm_ on each\n"
               "  rank's own parameters (on shards the replicas drift); --check-replicas N compares the\n"
               "  replicated parameters across the ranks every N steps (default 10; 0: never)\n",
               why.c_str());
  std::exit(2);
}

// One option `k` (and its value) into `a`; false when `k` is none.
bool parse_option(Args& a, const std::string& k, const std::function<std::string()>& value) {
  if (k == "--model") a.model = value();
  else if (k == "--plan") a.plan = value();
  else if (k == "--ranks") a.ranks = shardplan::count_option_int(k, value(), 1, 4096);
  else if (k == "--steps") a.steps = shardplan::count_option_int(k, value(), 1);
  else if (k == "--batch") a.batch = shardplan::count_option_int(k, value(), 1);
  else if (k == "--lr") a.lr = shardplan::examples::option_double(value());
  else if (k == "--generate") a.generate = shardplan::count_option_int(k, value(), 0);
  else if (k == "--prompt") a.prompt = value();
  else if (k == "--verify") a.verify = true;
  else if (k == "--compare") a.compare = true;
  else if (k == "--clip") a.clip = shardplan::examples::clip_option(value());
  else if (k == "--clip-with") {
    const std::string with = value();
    if (with != "shardplan" && with != "torch") usage("--clip-with takes shardplan or torch, got '" + with + "'");
    a.clip_with_torch = with == "torch";
  } else if (k == "--check-replicas") a.check_replicas = shardplan::count_option_int(k, value(), 0);
  else return false;
  return true;
}

Args parse(int argc, char** argv) {
  Args a;
  bool ranks_given = false, clip_with_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    ranks_given = ranks_given || k == "--ranks";
    clip_with_given = clip_with_given || k == "--clip-with";
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value for " + k);
      return argv[++i];
    };
    try {
      if (!parse_option(a, k, value)) usage("unknown argument '" + k + "'");
    } catch (const shardplan::CountError& e) {
      usage(e.what());
    } catch (const std::logic_error&) {
      usage("bad value for " + k + ": '" + argv[i] + "'");
    }
  }
  if (a.model.empty() || a.plan.empty()) usage("--model and --plan are required");
  if (a.ranks < 1 || a.steps < 1 || a.batch < 1) usage("--ranks, --steps and --batch must be positive");
  if (clip_with_given && a.clip == 0) usage("--clip-with takes effect with --clip X only");
  if (a.generate < 0) usage("--generate must be 0 (none) or more bytes");
  if (a.generate > 0 && a.prompt.empty()) usage("--prompt is empty; generation needs at least one byte");
  if (ranks_given && shardplan::WorldOptions::env_has_job())
    usage("--ranks runs ranks as threads; do not combine it with a launcher");
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

// What a run of the module gives: each step's loss, then the generation.
struct Run {
  std::vector<double> losses;
  std::vector<double> norms;  // with --clip, before clipping
  shardplan::examples::ScriptGeneration generation;
};

// What a step does besides forward, backward and Adam.
struct StepHooks {
  std::function<double()> clip;              // --clip, after backward: the norm (empty: none)
  std::function<void(int step)> after_step;  // the replica check (empty: none)
};

// torch's clip_grad_norm_ over `m`'s own parameters (a tied tensor once).
double torch_clip(const torch::jit::Module& m, double max_norm) {
  return torch::nn::utils::clip_grad_norm_(shardplan::unique_parameters(m), max_norm);
}

// Trains `m` in place on `data`, then generates; `agree`: the ranks that
// must generate the same text.
Run train_and_generate(torch::jit::Module& m, const std::vector<Batch>& data, const Args& a, int64_t context,
                       shardplan::Communicator* agree, const StepHooks& hooks) {
  std::vector<torch::Tensor> params;
  for (const auto& p : m.parameters()) params.push_back(p);
  torch::optim::Adam opt(params, torch::optim::AdamOptions(a.lr));
  Run run;
  for (const Batch& b : data) {
    opt.zero_grad();
    torch::Tensor logits = m.forward({b.input}).toTensor();
    torch::Tensor loss = torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), b.target.reshape({-1}));
    loss.backward();
    if (hooks.clip) run.norms.push_back(hooks.clip());
    opt.step();
    run.losses.push_back(loss.item<double>());
    if (hooks.after_step) hooks.after_step(static_cast<int>(run.losses.size()));
  }
  if (a.generate > 0) run.generation = shardplan::examples::generate_script(m, a.prompt, a.generate, context, agree);
  return run;
}

// A copy of `model` to train unsharded, its parameters leaves that require
// grad as the original's do.
torch::jit::Module unsharded_copy(const torch::jit::Module& model) {
  torch::jit::Module copy;
  {
    torch::NoGradGuard no_grad;  // else the clone's parameters are not leaves
    copy = model.clone();
  }
  // A tensor cloned under the guard does not require grad.
  auto originals = model.named_parameters().begin();
  for (const auto& p : copy.named_parameters()) p.value.requires_grad_((*originals++).value.requires_grad());
  return copy;
}

// Whether the unsharded run `want` generated what `got` did: the same text,
// and each byte's logits within `tolerance` relative to max(1, their
// magnitude), as verify_script measures.
bool same_generation(const Args& a, const shardplan::examples::ScriptGeneration& want,
                     const shardplan::examples::ScriptGeneration& got, double tolerance) {
  if (want.text != got.text) {
    std::printf("unsharded generated a different text: \"%s|%s\"\n", printable(a.prompt).c_str(),
                printable(want.text).c_str());
    return false;
  }
  const double worst = (want.logits - got.logits).abs().max().item<double>();
  const double magnitude = want.logits.abs().max().item<double>();
  std::printf("unsharded generated the same text; largest logit difference %.3g (largest magnitude %.3g)\n", worst,
              magnitude);
  return worst <= tolerance * std::max(1.0, magnitude);
}

// Trains the unsharded module on the same batches: 0 when every loss is
// within the tolerance of `sharded`'s and it generates the same.
int compare(const torch::jit::Module& model, const std::vector<Batch>& data, const Args& a, int64_t context,
            const Run& sharded) {
  torch::jit::Module unsharded = unsharded_copy(model);
  StepHooks hooks;
  if (a.clip > 0) hooks.clip = [&] { return torch_clip(unsharded, a.clip); };
  const Run want = train_and_generate(unsharded, data, a, context, nullptr, hooks);
  double worst = 0;
  for (size_t s = 0; s < want.losses.size(); ++s) worst = std::max(worst, std::abs(want.losses[s] - sharded.losses[s]));
  // Norms: relative (they are in the hundreds where losses are near 5).
  for (size_t s = 0; s < want.norms.size(); ++s)
    worst = std::max(worst, std::abs(want.norms[s] - sharded.norms[s]) / std::max(1.0, std::abs(want.norms[s])));
  const bool float64 = model.parameters().begin().operator*().scalar_type() == torch::kDouble;
  const double tolerance = float64 ? 1e-9 : 1e-4;
  std::printf("largest loss%s difference to the unsharded module over %d steps: %.3g (tolerance %.0g)\n",
              a.clip > 0 ? " or norm" : "", a.steps, worst, tolerance);
  const bool generated = a.generate == 0 || same_generation(a, want.generation, sharded.generation, tolerance);
  return worst <= tolerance && generated ? 0 : 1;
}

// The verification --verify asks for, passed to parallelize_script; exits 1
// when it fails. Each process verifies (on threads of its own): its ranks
// need the result.
shardplan::ScriptOptions verified(const Args& a, const torch::jit::Module& model, const shardplan::Plan& plan,
                                  const torch::Tensor& probe) {
  shardplan::ScriptOptions options;
  if (!a.verify) return options;
  const auto where = shardplan::examples::placement_of(a.ranks);
  auto v = std::make_shared<shardplan::ScriptVerification>(
      shardplan::verify_script(model, plan, where.world_size, {probe}));
  if (where.holds_rank0 || !v->passed()) std::printf("verify:\n%s\n", v->str().c_str());
  if (!v->passed()) std::exit(1);
  options.verified = v;
  return options;
}

// The replica check after `step`; a drift stops the run naming the step.
void check_replicas_at(int step, torch::jit::Module& m, const shardplan::ParallelReport& report,
                       shardplan::World& world) {
  try {
    shardplan::check_replicas(m, report, world);
  } catch (const shardplan::Error& e) {
    throw shardplan::Error("step " + std::to_string(step) + ": " + e.what());
  }
}

// Shards `model` on every rank of this process and trains it; rank 0's run,
// or nothing in a process without rank 0.
std::optional<Run> run_sharded(const Args& a, const torch::jit::Module& model, const shardplan::Plan& plan,
                               const std::vector<Batch>& data, int64_t context) {
  const shardplan::ScriptOptions options = verified(a, model, plan, data.front().input);
  std::optional<Run> lead;
  std::mutex mu;
  shardplan::examples::run_ranks(a.ranks, [&](shardplan::World& world, int) {
    shardplan::ScriptParallel sp = shardplan::parallelize_script(model, plan, world, options);
    if (world.rank() == 0) std::printf("%s", sp.report.table().c_str());
    StepHooks hooks;
    if (a.clip > 0 && a.clip_with_torch) hooks.clip = [&] { return torch_clip(*sp.module, a.clip); };
    if (a.clip > 0 && !a.clip_with_torch)
      hooks.clip = [&] { return shardplan::clip_grad_norm_(*sp.module, sp.report, world, a.clip); };
    if (a.check_replicas > 0)
      hooks.after_step = [&](int step) {
        if (step % a.check_replicas == 0) check_replicas_at(step, *sp.module, sp.report, world);
      };
    Run mine = train_and_generate(*sp.module, data, a, context, &world.comm(), hooks);
    std::lock_guard<std::mutex> lock(mu);
    if (world.rank() == 0) lead = std::move(mine);
  });
  return lead;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    const torch::jit::Module model = shardplan::load_script_module(a.model);
    const shardplan::Plan plan = shardplan::load_plan(a.plan);
    const int64_t context = model.hasattr("context") ? model.attr("context").toInt() : 64;
    const auto data = batches(a, context);
    const std::optional<Run> run = run_sharded(a, model, plan, data, context);
    if (!run) return 0;
    for (size_t s = 0; s < run->losses.size(); ++s) {
      std::printf("step %3zu  loss %.10f", s + 1, run->losses[s]);
      if (s < run->norms.size()) std::printf("  norm %.12e", run->norms[s]);
      std::printf("\n");
    }
    if (a.generate > 0)
      std::printf("generated %d bytes: \"%s|%s\"\n", a.generate, printable(a.prompt).c_str(),
                  printable(run->generation.text).c_str());
    return a.compare ? compare(model, data, a, context, *run) : 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);  // the error on a line of its own after what the ranks printed
    std::fprintf(stderr, "train_script: %s\n", e.what());
    return 1;
  }
}
