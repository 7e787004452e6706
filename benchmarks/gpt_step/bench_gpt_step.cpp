// Cost of the framework at world size 1 on a real model: a training step of
// the example GPT (examples/models/gpt.h, built from shardplan layers) with
// plans/gpt.yaml applied on a world of one rank, against the same network
// written here from torch::nn layers (Embedding, LayerNorm,
// MultiheadAttention, Linear, CrossEntropyLoss) with identical weights. Both
// run interleaved in one process, alternating which goes first each round,
// so machine noise hits them alike; the figure is the ratio of median step
// times (target <= 1.03, docs/BENCHMARKS.md).
//
// An unplanned shardplan model would be no baseline: with no strategy its
// layers are torch::nn's computation by construction. The baseline here
// shares no code with shardplan.
#include <time.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "shardplan/count_option.h"
#include "shardplan/threads.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace {

using shardplan::examples::GPTConfig;

// examples/models/gpt.cpp's GPT, module for module and name for name, from
// torch::nn only.
struct RefBlockImpl : torch::nn::Module {
  explicit RefBlockImpl(const GPTConfig& c) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embed})));
    attn = register_module("attn", torch::nn::MultiheadAttention(
                                       torch::nn::MultiheadAttentionOptions(c.embed, c.heads).dropout(c.dropout)));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embed})));
    fc1 = register_module("fc1", torch::nn::Linear(c.embed, c.mlp));
    fc2 = register_module("fc2", torch::nn::Linear(c.mlp, c.embed));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    torch::Tensor h = ln1->forward(x);
    torch::Tensor y = x + std::get<0>(attn->forward(h, h, h, {}, /*need_weights=*/false, mask));
    return y + fc2->forward(torch::gelu(fc1->forward(ln2->forward(y))));
  }
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::MultiheadAttention attn{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

struct RefGPT : torch::nn::Module {
  explicit RefGPT(const GPTConfig& c) {
    tok_emb = register_module("tok_emb", torch::nn::Embedding(c.vocab, c.embed));
    pos_emb = register_module("pos_emb", torch::nn::Embedding(c.context, c.embed));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.layers; ++i) blocks->push_back(std::make_shared<RefBlockImpl>(c));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embed})));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(c.embed, c.vocab).bias(false)));
    loss_fn = register_module("loss", torch::nn::CrossEntropyLoss());
  }
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& target) {
    const int64_t t = tokens.size(1);
    torch::Tensor x = tok_emb->forward(tokens.t()) + pos_emb->forward(torch::arange(t, tokens.options())).unsqueeze(1);
    const torch::Tensor mask = torch::full({t, t}, -std::numeric_limits<double>::infinity(), x.options()).triu(1);
    for (const auto& block : *blocks) x = block->as<RefBlockImpl>()->forward(x, mask);
    torch::Tensor logits = head->forward(ln_f->forward(x));
    return loss_fn->forward(logits.reshape({-1, logits.size(-1)}), target.t().reshape(-1));
  }
  torch::nn::Embedding tok_emb{nullptr}, pos_emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
  torch::nn::CrossEntropyLoss loss_fn{nullptr};
};

struct Runner {
  std::function<torch::Tensor()> loss;
  std::unique_ptr<torch::optim::Adam> opt;
  double step() {
    opt->zero_grad();
    auto l = loss();
    l.backward();
    opt->step();
    return l.item<double>();
  }
};

// CPU time of the whole process (every intra-op thread): on a shared machine
// it moves less than wall time when other jobs take the cores away.
double process_cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void math_threads(int n) { shardplan::set_num_threads(n); }

struct Shape {
  const char* label;
  shardplan::examples::Overrides config;
  int64_t batch;
  int steps;  // per timed block
};

}  // namespace

int main(int argc, char** argv) {
  std::string plan_path = "plans/gpt.yaml";
  int rounds = 21, threads = 1;
  bool verbose = false;
  std::vector<std::string> drop;  // rules to leave out, to see what each layer's plugin costs
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--plan") plan_path = argv[i + 1];
    else if (k == "--rounds") rounds = static_cast<int>(shardplan::count_or_exit(argv[0], k, argv[i + 1], 1, INT_MAX));
    else if (k == "--threads") threads = static_cast<int>(shardplan::count_or_exit(argv[0], k, argv[i + 1], 1, 4096));
    else if (k == "--verbose") verbose = shardplan::count_or_exit(argv[0], k, argv[i + 1], 0, 1) != 0;
    else if (k == "--drop") {
      std::string list = argv[i + 1];
      for (size_t at = 0; at <= list.size();) {
        size_t comma = std::min(list.find(',', at), list.size());
        if (comma > at) drop.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
    }
    else {
      std::fprintf(stderr, "usage: %s [--plan plans/gpt.yaml] [--rounds N] [--threads N] [--drop S1,S2] [--verbose 1]\n"
                           "  --drop: leave out the plan's rules whose pattern contains S1 or S2\n", argv[0]);
      return 2;
    }
  }
  math_threads(threads);
  const std::vector<Shape> shapes = {
      {"default (train_gpt)", {}, 16, 4},
      {"embed 256, 4 layers", {{"embed", "256"}, {"heads", "8"}, {"layers", "4"}, {"mlp", "1024"}}, 16, 2},
  };

  shardplan::WorldOptions wo;
  wo.backend = "local";
  wo.backend_options = {"local_id=bench_gpt_step"};
  auto world = shardplan::init_world(wo);
  auto plan = shardplan::load_plan(plan_path);
  std::string dropped;
  for (auto it = plan.rules.begin(); it != plan.rules.end();) {
    bool hit = false;
    for (const auto& d : drop) hit = hit || it->pattern.find(d) != std::string::npos;
    if (hit) {
      dropped += " '" + it->pattern + "'";
      it = plan.rules.erase(it);
    } else {
      ++it;
    }
  }

  std::printf("GPT training step (Adam), world size 1, %s applied vs the same network from torch::nn layers;\n"
              "median of %d interleaved rounds, %d intra-op thread(s)\n",
              plan_path.c_str(), rounds, threads);
  if (!dropped.empty()) std::printf("rules left out:%s\n", dropped.c_str());
  std::printf("wall and process-CPU ms per step (medians); ratio = shardplan / torch::nn of the medians, paired =\n"
              "median over rounds of the ratio of that round's two blocks\n");
  std::printf("%-22s %-32s %6s %9s %9s %7s %7s %8s %8s %7s %7s %9s\n", "model", "config", "batch", "nn wall",
              "sp wall", "ratio", "paired", "nn cpu", "sp cpu", "ratio", "paired", "loss diff");
  for (const auto& s : shapes) {
    const auto config = GPTConfig::from(s.config);
    torch::manual_seed(0);
    auto ours = std::make_shared<shardplan::examples::GPTImpl>(config);
    auto report = shardplan::parallelize(*ours, plan, *world);
    if (verbose) std::printf("%s", report.table().c_str());
    auto ref = std::make_shared<RefGPT>(config);
    {
      torch::NoGradGuard no_grad;
      auto mine = ours->named_parameters();
      auto theirs = ref->named_parameters();
      if (mine.size() != theirs.size()) {
        std::fprintf(stderr, "parameter count differs: %zu vs %zu\n", mine.size(), theirs.size());
        return 1;
      }
      for (auto& p : theirs) {
        const auto* src = mine.find(p.key());
        if (!src) {
          std::fprintf(stderr, "torch::nn model has '%s', the example GPT does not\n", p.key().c_str());
          return 1;
        }
        p.value().copy_(*src);
      }
    }
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
    const auto tokens = torch::randint(config.vocab, {s.batch, config.context}, gen, torch::kLong);
    const auto target = torch::randint(config.vocab, {s.batch, config.context}, gen, torch::kLong);
    Runner a{[&] { return ref->loss(tokens, target); }, std::make_unique<torch::optim::Adam>(ref->parameters())};
    Runner b{[&] { return ours->loss({tokens, target}); }, std::make_unique<torch::optim::Adam>(ours->parameters())};
    // Same weights, same batch: the first losses must agree (shardplan's
    // layers promise bit-identical results at world size 1).
    double diff = std::abs(a.loss().item<double>() - b.loss().item<double>());
    if (verbose) std::printf("loss before any step: difference %g\n", diff);
    diff = std::max(diff, std::abs(a.step() - b.step()));
    for (int i = 0; i < 4; ++i) diff = std::max(diff, std::abs(a.step() - b.step()));
    std::vector<double> ta, tb, ca, cb;
    for (int r = 0; r < rounds; ++r) {
      for (int k = 0; k < 2; ++k) {
        Runner& run = ((r + k) % 2 == 0) ? a : b;
        const double c0 = process_cpu_ms();
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < s.steps; ++i) run.step();
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / s.steps;
        const double cpu = (process_cpu_ms() - c0) / s.steps;
        (&run == &a ? ta : tb).push_back(ms);
        (&run == &a ? ca : cb).push_back(cpu);
      }
    }
    const double ma = median(ta), mb = median(tb);
    // Each round's two blocks ran back to back: their ratio cancels load that
    // drifts over the run.
    std::vector<double> paired, paired_cpu;
    for (size_t r = 0; r < ta.size(); ++r) {
      paired.push_back(tb[r] / ta[r]);
      paired_cpu.push_back(cb[r] / ca[r]);
    }
    std::printf("%-22s %-32s %6lld %9.2f %9.2f %7.3f %7.3f %8.2f %8.2f %7.3f %7.3f %9.2g\n", s.label,
                (std::to_string(config.embed) + "/" + std::to_string(config.heads) + "h/" +
                 std::to_string(config.layers) + "L/mlp" + std::to_string(config.mlp) + "/ctx" +
                 std::to_string(config.context) + "/V" + std::to_string(config.vocab))
                    .c_str(),
                static_cast<long long>(s.batch), ma, mb, mb / ma, median(paired), median(ca), median(cb),
                median(cb) / median(ca), median(paired_cpu), diff);
  }
  return 0;
}
