// What running a model as TorchScript under a plan costs (docs/BENCHMARKS.md,
// "TorchScript under a plan"):
//
//  1. Training tokens/s at --ranks thread ranks of the GPT that
//     examples/export_script_gpt.py exports, sharded by parallelize_script
//     under examples/script_gpt.yaml, against the same network from
//     shardplan::nn layers (examples/models/gpt.h) under plans/gpt.yaml, and
//     under plans/gpt.yaml with the LM head gathered and a plain
//     cross-entropy, which is what the script plan does (TorchScript gets no
//     vocab-parallel loss): that pair differs only in how the model is
//     written. The same pair unsharded (each rank training a whole copy,
//     so the cores are as busy) gives what TorchScript itself costs against
//     C++; the sharded ratio over the unsharded one is what the plan's
//     rewrite adds. Same sizes (read from the module), same weights (copied
//     from it), same batches. Blocks of steps are interleaved, the order rotating
//     each round, so load from other jobs on a shared machine hits every
//     variant alike; ratios are of medians and, paired, the median over
//     rounds of each round's own ratio.
//  2. The time parallelize_script takes on a module of 2 x --linears
//     parameters (Linear layers with bias, column- and row-parallel in
//     turn), median of --runs, at --ranks thread ranks.
//
//   bench_script --model gpt.pt [--ranks 2] [--rounds 11] [--steps 4]
//                [--batch 8] [--warmup 3] [--linears 500] [--width 16] [--runs 7]
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "shardplan/parallelize.h"
#include "shardplan/count_option.h"
#include "shardplan/plan.h"
#include "shardplan/script.h"
#include "shardplan/world.h"

namespace {

using shardplan::examples::GPTConfig;
using shardplan::examples::GPTImpl;
using TensorMap = std::map<std::string, torch::Tensor>;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string model;
  std::string script_plan = SHARDPLAN_SOURCE_DIR "/examples/script_gpt.yaml";
  std::string nn_plan = SHARDPLAN_SOURCE_DIR "/plans/gpt.yaml";
  int ranks = 2, rounds = 11, steps = 4, warmup = 3, linears = 500, runs = 7;
  int64_t batch = 8, width = 16;
};

const char* kUsage =
    "usage: bench_script --model GPT.pt [--ranks N] [--rounds R] [--steps S] [--batch B] [--warmup S]\n"
    "                    [--linears L] [--width W] [--runs K] [--script-plan YAML] [--nn-plan YAML]\n";

// What is wrong with the command line (main prints it with kUsage, exit 2).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

Args parse(int argc, char** argv) {
  Args a;
  const std::map<std::string, int*> ints = {{"--ranks", &a.ranks},   {"--rounds", &a.rounds},
                                            {"--steps", &a.steps},   {"--linears", &a.linears},
                                            {"--runs", &a.runs},     {"--warmup", &a.warmup}};
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) throw UsageError("missing value for " + k);
    const std::string v = argv[i + 1];
    try {
      if (ints.count(k)) *ints.at(k) = shardplan::count_option_int(k, v, k == "--warmup" ? 0 : 1);
      else if (k == "--batch") a.batch = shardplan::count_option(k, v, 1, INT_MAX);
      else if (k == "--width") a.width = shardplan::count_option(k, v, 1, INT_MAX);
      else if (k == "--model") a.model = v;
      else if (k == "--script-plan") a.script_plan = v;
      else if (k == "--nn-plan") a.nn_plan = v;
      else throw UsageError("unknown argument '" + k + "'");
    } catch (const shardplan::CountError& e) {
      throw UsageError(e.what());
    }
  }
  if (a.model.empty()) throw UsageError("--model is required");
  if (a.warmup < 0 || a.ranks < 1 || a.rounds < 1 || a.steps < 1 || a.batch < 1 || a.runs < 1 || a.linears < 1 ||
      a.width < 1)
    throw UsageError("every count must be positive");
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TensorMap params_of(const torch::jit::Module& m) {
  TensorMap out;
  for (const auto& p : m.named_parameters()) out[p.name] = p.value;
  return out;
}

int64_t numel(const TensorMap& m) {
  int64_t n = 0;
  for (const auto& kv : m) n += kv.second.numel();
  return n;
}

// The C++ GPT's sizes from the exported module's shapes and head count.
GPTConfig config_of(const torch::jit::Module& m, const TensorMap& p) {
  GPTConfig c;
  c.vocab = p.at("tok_emb.weight").size(0);
  c.embed = p.at("tok_emb.weight").size(1);
  c.context = p.at("pos_emb").size(0);
  c.mlp = p.at("blocks.0.fc1.weight").size(0);
  c.heads = m.attr("blocks").toModule().attr("0").toModule().attr("attn").toModule().attr("n_head").toInt();
  c.layers = 0;
  while (p.count("blocks." + std::to_string(c.layers) + ".fc1.weight")) ++c.layers;
  return c;
}

// The script module's tensor(s) that make the C++ GPT's parameter `name`:
// MultiheadAttention keeps q, k and v stacked (in_proj) and calls the output
// projection out_proj; the position table is an Embedding's weight.
torch::Tensor source_of(const std::string& name, const TensorMap& src) {
  auto ends = [&](const std::string& tail) {
    return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  auto stem = [&](const std::string& tail) { return name.substr(0, name.size() - tail.size()); };
  if (name == "pos_emb.weight") return src.at("pos_emb");
  for (const std::string kind : {"weight", "bias"}) {
    if (ends("in_proj_" + kind)) {
      const std::string at = stem("in_proj_" + kind);
      return torch::cat({src.at(at + "q." + kind), src.at(at + "k." + kind), src.at(at + "v." + kind)});
    }
    if (ends("out_proj." + kind)) return src.at(stem("out_proj." + kind) + "proj." + kind);
  }
  return src.at(name);
}

// The shardplan::nn GPT of `config` with the script module's weights.
std::shared_ptr<GPTImpl> nn_twin(const GPTConfig& config, const TensorMap& src) {
  auto gpt = std::make_shared<GPTImpl>(config);
  torch::NoGradGuard no_grad;
  for (auto& p : gpt->named_parameters()) {
    const torch::Tensor s = source_of(p.key(), src);
    if (s.sizes() != p.value().sizes())
      throw std::runtime_error("shape of " + p.key() + " differs from the script module's");
    p.value().copy_(s);
  }
  return gpt;
}

// plans/gpt.yaml with the LM head's logits gathered and no vocab-parallel
// loss: the LM head as examples/script_gpt.yaml plans it.
shardplan::Plan gathered_head(shardplan::Plan plan) {
  plan.rules.erase(std::remove_if(plan.rules.begin(), plan.rules.end(),
                                  [](const shardplan::Rule& r) { return r.pattern == "loss"; }),
                   plan.rules.end());
  for (auto& r : plan.rules)
    if (r.pattern.rfind("head", 0) == 0) r.options.erase("output");
  return plan;
}

using shardplan::examples::Batch;

struct Runner {
  std::string name;
  std::function<torch::Tensor(const Batch&)> loss;
  std::unique_ptr<torch::optim::Adam> opt;
  std::vector<double> tokens_per_s;
};

// The variants, in the order the table prints them.
enum Variant { kScriptTp, kNnTp, kNnTpGathered, kScriptOne, kNnOne };

struct Training {
  GPTConfig config;
  int64_t script_params = 0, nn_params = 0;
  std::vector<std::string> names;
  std::vector<double> first_loss;
  std::vector<std::vector<double>> tokens_per_s;  // per variant, per round
};

void steps(Runner& run, const std::vector<Batch>& data, int n) {
  for (int s = 0; s < n; ++s) {
    run.opt->zero_grad();
    run.loss(data[s % data.size()]).backward();
    run.opt->step();
  }
}

// Rank-local: times `steps` steps of each runner per round, the order
// rotating. The barriers line the ranks up, so a block's time is the
// slowest rank's, as a step's is.
void time_blocks(shardplan::World& world, std::vector<Runner>& runners, const std::vector<Batch>& data,
                 const Args& a, int64_t tokens_per_step) {
  // TorchScript's profiling executor optimizes a graph only after its first
  // runs: untimed steps first, for every variant alike.
  for (auto& run : runners) steps(run, data, a.warmup);
  for (int r = 0; r < a.rounds; ++r) {
    for (size_t k = 0; k < runners.size(); ++k) {
      Runner& run = runners[(r + k) % runners.size()];
      world.comm().barrier();
      const auto t0 = Clock::now();
      steps(run, data, a.steps);
      world.comm().barrier();
      const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
      run.tokens_per_s.push_back(tokens_per_step * a.steps / sec);
    }
  }
}

Runner script_runner(const std::string& name, const std::shared_ptr<torch::jit::Module>& m) {
  std::vector<torch::Tensor> params;
  for (const auto& p : m->parameters()) params.push_back(p);
  auto loss = [m](const Batch& b) {
    torch::Tensor logits = m->forward({b.input}).toTensor();
    return torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), b.target.reshape({-1}));
  };
  return {name, loss, std::make_unique<torch::optim::Adam>(params)};
}

Runner nn_runner(const std::string& name, const std::shared_ptr<GPTImpl>& m) {
  return {name, [m](const Batch& b) { return m->loss(b); }, std::make_unique<torch::optim::Adam>(m->parameters())};
}

struct Plans {
  shardplan::Plan script, nn, nn_gathered;
};

// One rank's runners, in Variant order. The unsharded pair runs on every
// rank at once, each a whole model on its own core: what TorchScript itself
// costs against C++ with the cores as loaded as in the sharded runs.
std::vector<Runner> make_runners(shardplan::World& world, const Args& a, const Plans& plans,
                                 const torch::jit::Module& script, const GPTConfig& config, const TensorMap& src) {
  std::vector<Runner> runners;
  runners.push_back(script_runner("script, script_gpt.yaml",
                                  shardplan::parallelize_script(script, plans.script, world).module));
  auto nn = nn_twin(config, src), nn_g = nn_twin(config, src);
  shardplan::parallelize(*nn, plans.nn, world);
  shardplan::parallelize(*nn_g, plans.nn_gathered, world);
  runners.push_back(nn_runner("nn, gpt.yaml", nn));
  runners.push_back(nn_runner("nn, gpt.yaml head gathered", nn_g));
  auto whole = std::make_shared<torch::jit::Module>(torch::jit::load(a.model));  // never run: its own graphs
  runners.push_back(script_runner("script, unsharded", whole));
  runners.push_back(nn_runner("nn, unsharded", nn_twin(config, src)));
  return runners;
}

Training train(const Args& a) {
  const torch::jit::Module script = torch::jit::load(a.model);
  const TensorMap src = params_of(script);
  Training out;
  out.config = config_of(script, src);
  out.script_params = numel(src);
  for (const auto& p : nn_twin(out.config, src)->parameters()) out.nn_params += p.numel();
  Plans plans{shardplan::load_plan(a.script_plan), shardplan::load_plan(a.nn_plan), {}};
  plans.nn_gathered = gathered_head(plans.nn);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  std::vector<Batch> data;
  for (int s = 0; s < std::min(a.steps, 4); ++s) {
    torch::Tensor w = torch::randint(out.config.vocab, {a.batch, out.config.context + 1}, gen, torch::kLong);
    data.push_back({w.narrow(1, 0, out.config.context), w.narrow(1, 1, out.config.context)});
  }
  shardplan::run_ranks_in_threads(a.ranks, [&](shardplan::World& world) {
    std::vector<Runner> runners = make_runners(world, a, plans, script, out.config, src);
    std::vector<double> first;  // the same weights and batch: the same loss, or the twins differ
    for (auto& run : runners) first.push_back(run.loss(data[0]).item<double>());
    time_blocks(world, runners, data, a, a.batch * out.config.context);
    if (world.rank() != 0) return;
    out.first_loss = first;
    for (auto& run : runners) {
      out.names.push_back(run.name);
      out.tokens_per_s.push_back(run.tokens_per_s);
    }
  });
  return out;
}

// median(a) / median(b), and the median over rounds of a[r] / b[r].
std::pair<double, double> ratio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> paired;
  for (size_t r = 0; r < a.size(); ++r) paired.push_back(a[r] / b[r]);
  return {median(a) / median(b), median(paired)};
}

void print_training(const Args& a, const Training& t) {
  std::printf("GPT training (Adam), %d thread ranks: %s, %lld parameters as TorchScript, %lld as shardplan::nn\n",
              a.ranks, t.config.str().c_str(), static_cast<long long>(t.script_params),
              static_cast<long long>(t.nn_params));
  std::printf("batch %lld, %d warm-up steps, then %d rounds of %d steps per variant, interleaved; tokens/s are\n"
              "medians over rounds (the unsharded ones per rank, every rank running one)\n",
              static_cast<long long>(a.batch), a.warmup, a.rounds, a.steps);
  std::printf("%-28s %10s %14s\n", "variant", "tokens/s", "first loss");
  for (size_t v = 0; v < t.names.size(); ++v)
    std::printf("%-28s %10.0f %14.8f\n", t.names[v].c_str(), median(t.tokens_per_s[v]), t.first_loss[v]);
  std::printf("ratios, script / nn (of the medians; paired = median over rounds of each round's ratio):\n");
  const auto& s = t.tokens_per_s;
  const auto tp = ratio(s[kScriptTp], s[kNnTp]), tpg = ratio(s[kScriptTp], s[kNnTpGathered]),
             one = ratio(s[kScriptOne], s[kNnOne]);
  std::printf("  sharded, gpt.yaml                 %.3f (paired %.3f)\n", tp.first, tp.second);
  std::printf("  sharded, gpt.yaml head gathered   %.3f (paired %.3f)\n", tpg.first, tpg.second);
  std::printf("  unsharded                         %.3f (paired %.3f)\n", one.first, one.second);
  std::vector<double> share;  // per round: what is left of the sharded ratio once TorchScript's own is divided out
  for (size_t r = 0; r < s[kScriptTp].size(); ++r)
    share.push_back(s[kScriptTp][r] / s[kNnTpGathered][r] / (s[kScriptOne][r] / s[kNnOne][r]));
  std::printf("  sharded (head gathered) / unsharded  %.3f (paired %.3f): 1 when the plan's rewrite costs nothing\n",
              tpg.first / one.first, median(share));
}

// A scripted module of n Linear layers with bias (one class type shared by
// all, as Python's nn.Linear is), called in turn by forward: l0, l1, ...
torch::jit::Module linear_stack(int n, int64_t width) {
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  torch::jit::Module top(c10::QualifiedName("__torch__.Stack"), cu);
  torch::jit::Module first(c10::QualifiedName("__torch__.Linear"), cu);
  // Every module Python scripts has `training`; one without it reads as frozen.
  top.register_attribute("training", c10::BoolType::get(), true);
  first.register_parameter("weight", torch::randn({width, width}) / std::sqrt(double(width)), false);
  first.register_parameter("bias", torch::zeros({width}), false);
  first.define("def forward(self, x):\n  return torch.linear(x, self.weight, self.bias)\n");
  std::string src = "def forward(self, x):\n";
  for (int i = 0; i < n; ++i) {
    torch::jit::Module lin = i == 0 ? first : torch::jit::Module(cu, first.type());
    lin.register_attribute("training", c10::BoolType::get(), true);
    lin.register_parameter("weight", torch::randn({width, width}) / std::sqrt(double(width)), false);
    lin.register_parameter("bias", torch::zeros({width}), false);
    top.register_module("l" + std::to_string(i), lin);
    src += "  x = self.l" + std::to_string(i) + ".forward(x)\n";
  }
  top.define(src + "  return x\n");
  return top;
}

// Megatron pairs all the way down: even layers column-parallel with their
// output left sharded, odd ones row-parallel reading it.
const char* kStackPlan = R"(
mesh: {model: auto}
rules:
  - {match: 'l\d*[02468]\.weight', layout: [model, null], output: sharded}
  - {match: 'l\d*[13579]\.weight', layout: [null, model], input: sharded}
)";

// False when the report does not have a row for each of the 2n parameters.
bool time_parallelize(const Args& a) {
  const torch::jit::Module stack = linear_stack(a.linears, a.width);
  const shardplan::Plan plan = shardplan::parse_plan(kStackPlan, "stack.yaml");
  std::vector<double> ms;
  size_t params = 0;
  for (int run = 0; run < a.runs; ++run) {
    shardplan::run_ranks_in_threads(a.ranks, [&](shardplan::World& world) {
      world.comm().barrier();
      const auto t0 = Clock::now();
      shardplan::ScriptParallel sp = shardplan::parallelize_script(stack, plan, world);
      const double t = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (world.rank() == 0) {
        ms.push_back(t);
        params = sp.report.rows.size();
      }
    });
  }
  std::printf("parallelize_script, %zu parameters (%d Linear %lldx%lld with bias, column/row in turn), %d thread "
              "ranks: median %.1f ms, min %.1f, max %.1f over %d runs\n",
              params, a.linears, static_cast<long long>(a.width), static_cast<long long>(a.width), a.ranks,
              median(ms), *std::min_element(ms.begin(), ms.end()), *std::max_element(ms.begin(), ms.end()), a.runs);
  return params == 2 * static_cast<size_t>(a.linears);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "bench_script: %s\n%s", e.what(), kUsage);
    return 2;
  }
  try {
    const Training t = train(a);
    print_training(a, t);
    if (t.script_params != t.nn_params) {
      std::fprintf(stderr, "bench_script: the two models' parameter counts differ\n");
      return 1;
    }
    for (double l : t.first_loss)
      if (std::abs(l - t.first_loss[0]) > 1e-3 * std::max(1.0, std::abs(l))) {
        std::fprintf(stderr, "bench_script: the first losses differ: the models are not the same network\n");
        return 1;
      }
    return time_parallelize(a) ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_script: %s\n", e.what());
    return 1;
  }
}
