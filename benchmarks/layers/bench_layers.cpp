// One forward+backward of each shardable layer, as a plan shards it, at world
// sizes 1 and 2 on the local and gloo backends, next to the torch::nn layer
// of the same global size in the same run. Figures, the command and how to
// read them are in docs/BENCHMARKS.md.
//
// Run plainly, ranks are threads of this process on every backend: with gloo
// they still talk over TCP on 127.0.0.1 through gloo's own event loop, as
// separate processes would, but share one allocator and one address space.
// Started by a launcher (`shardplan launch -n 2 --backend gloo -- bench_layers
// --iters=N`), each rank is a process of the launcher's world and the rows
// are that world's only; rank 0 prints. Every benchmark runs with one
// intra-op thread per rank (see main), so world size 2 uses both cores; the
// torch::nn rows are given at 1 and at 2 intra-op threads, the fair
// comparisons for "same compute per rank" and "same cores".
//
// A step resets the gradients, runs the forward, sums the output (or takes the
// loss) and runs the backward, with gradients w.r.t. the input too where a
// layer inside a network would need them.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdio>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shardplan/threads.h"
#include "shardplan/count_option.h"
#include "shardplan/nn/conv.h"
#include "shardplan/nn/cross_entropy.h"
#include "shardplan/nn/embedding.h"
#include "shardplan/nn/gelu.h"
#include "shardplan/nn/linear.h"
#include "shardplan/nn/lstm.h"
#include "shardplan/nn/multihead_attention.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"
#include "../common/lockstep.h"

namespace {

using shardplan::World;
using Step = std::function<void()>;

// Holds one layer under the name "layer", so every plan below reads alike.
template <class L>
struct Wrap : torch::nn::Module {
  explicit Wrap(L l) : layer(register_module("layer", std::move(l))) {}
  L layer;
};

// Parameters are initialised under a lock with a fixed seed: ranks are
// threads and would otherwise race on the global generator. The values do
// not matter for timing; identical ones keep the runs comparable.
std::mutex& init_mutex() {
  static std::mutex m;
  return m;
}

template <class L, class... Args>
std::shared_ptr<Wrap<L>> make_wrapped(Args&&... args) {
  std::lock_guard<std::mutex> lock(init_mutex());
  torch::manual_seed(0);
  return std::make_shared<Wrap<L>>(L(std::forward<Args>(args)...));
}

// A step over `model`: reset gradients (parameters and `inputs`), then
// backward from the scalar `loss()` returns.
template <class M>
Step step_of(std::shared_ptr<M> model, std::vector<at::Tensor> inputs, std::function<at::Tensor()> loss) {
  auto params = model->parameters();
  return [model, params, inputs, loss]() mutable {
    for (auto& p : params) p.mutable_grad().reset();
    for (auto& t : inputs) t.mutable_grad().reset();
    loss().backward();
  };
}

// Deterministic and identical on every rank without a shared generator.
at::Tensor ramp(at::IntArrayRef shape) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return torch::linspace(-1.0, 1.0, n).view(shape);
}

at::Tensor ids(at::IntArrayRef shape, int64_t vocab) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return (torch::arange(n, torch::kLong) * 7919 % vocab).view(shape);
}

// One layer in both forms. `torch_nn` builds the plain torch::nn step;
// `planned` builds this rank's step after applying `rules` on `world`.
struct Case {
  std::string rules;
  std::function<Step()> torch_nn;
  std::function<Step(World&, const shardplan::Plan&)> planned;
};

// ---------------------------------------------------------------- the layers

constexpr int64_t kTokens = 128, kDim = 1024;

Step linear_torch() {
  auto m = make_wrapped<torch::nn::Linear>(kDim, kDim);
  auto x = ramp({kTokens, kDim}).requires_grad_(true);
  return step_of(m, {x}, [m, x] { return m->layer->forward(x).sum(); });
}

Step linear_planned(World& w, const shardplan::Plan& plan) {
  auto m = make_wrapped<shardplan::nn::Linear>(kDim, kDim);
  shardplan::parallelize(*m, plan, w);
  auto x = ramp({kTokens, kDim}).requires_grad_(true);
  return step_of(m, {x}, [m, x] { return m->layer->forward(x).sum(); });
}

constexpr int64_t kVocab = 16384, kEmbDim = 256, kBatch = 32, kSeq = 128;

Step embedding_torch() {
  auto m = make_wrapped<torch::nn::Embedding>(kVocab, kEmbDim);
  auto x = ids({kBatch, kSeq}, kVocab);
  return step_of(m, {}, [m, x] { return m->layer->forward(x).sum(); });
}

Step embedding_planned(World& w, const shardplan::Plan& plan) {
  auto m = make_wrapped<shardplan::nn::Embedding>(kVocab, kEmbDim);
  shardplan::parallelize(*m, plan, w);
  auto x = ids({kBatch, kSeq}, kVocab);
  return step_of(m, {}, [m, x] { return m->layer->forward(x).sum(); });
}

constexpr int64_t kImages = 8, kCin = 32, kCout = 64, kSide = 16;

Step conv_torch() {
  auto m = make_wrapped<torch::nn::Conv2d>(torch::nn::Conv2dOptions(kCin, kCout, 3).padding(1));
  auto x = ramp({kImages, kCin, kSide, kSide}).requires_grad_(true);
  return step_of(m, {x}, [m, x] { return m->layer->forward(x).sum(); });
}

Step conv_planned(World& w, const shardplan::Plan& plan) {
  auto m = make_wrapped<shardplan::nn::Conv2d>(torch::nn::Conv2dOptions(kCin, kCout, 3).padding(1));
  shardplan::parallelize(*m, plan, w);
  auto x = ramp({kImages, kCin, kSide, kSide}).requires_grad_(true);
  return step_of(m, {x}, [m, x] { return m->layer->forward(x).sum(); });
}

// The loss of an LM head's logits, kTokens x kVocab. Sharded, each rank gets
// its slice of the class dim, as a column-parallel head with `output:
// sharded` would hand it.
Step ce_torch() {
  auto m = make_wrapped<torch::nn::CrossEntropyLoss>();
  auto x = ramp({kTokens, kVocab}).mul_(4).requires_grad_(true);
  auto t = ids({kTokens}, kVocab);
  return step_of(m, {x}, [m, x, t] { return m->layer->forward(x, t); });
}

Step ce_planned(World& w, const shardplan::Plan& plan) {
  auto m = make_wrapped<shardplan::nn::CrossEntropyLoss>();
  shardplan::parallelize(*m, plan, w);
  auto full = ramp({kTokens, kVocab}).mul_(4);
  auto x = shardplan::shard_of(full, 1, w.size(), w.rank()).clone().requires_grad_(true);
  auto t = ids({kTokens}, kVocab);
  return step_of(m, {x}, [m, x, t] { return m->layer->forward(x, t); });
}

// Sequence first, as both modules take it by default.
constexpr int64_t kLstmIn = 256, kLstmHidden = 256, kLstmSeq = 16, kLstmBatch = 16;

template <class L>
Step lstm_step(std::shared_ptr<Wrap<L>> m) {
  auto x = ramp({kLstmSeq, kLstmBatch, kLstmIn}).requires_grad_(true);
  return step_of(m, {x}, [m, x] { return std::get<0>(m->layer->forward(x)).sum(); });
}

Step lstm_torch() { return lstm_step(make_wrapped<torch::nn::LSTM>(kLstmIn, kLstmHidden)); }

Step lstm_planned(World& w, const shardplan::Plan& plan) {
  auto m = make_wrapped<shardplan::nn::LSTM>(kLstmIn, kLstmHidden);
  shardplan::parallelize(*m, plan, w);
  return lstm_step(m);
}

// Self-attention, no mask, no attention weights returned.
constexpr int64_t kEmbed = 256, kHeads = 8, kAttnSeq = 64, kAttnBatch = 8;

template <class L>
Step mha_step(std::shared_ptr<Wrap<L>> m) {
  auto x = ramp({kAttnSeq, kAttnBatch, kEmbed}).requires_grad_(true);
  return step_of(m, {x}, [m, x] { return std::get<0>(m->layer->forward(x, x, x, {}, false)).sum(); });
}

Step mha_torch() { return mha_step(make_wrapped<torch::nn::MultiheadAttention>(kEmbed, kHeads)); }

Step mha_planned(World& w, const shardplan::Plan& plan) {
  auto m = make_wrapped<shardplan::nn::MultiheadAttention>(kEmbed, kHeads);
  shardplan::parallelize(*m, plan, w);
  return mha_step(m);
}

std::map<std::string, Case>& cases() {
  static std::map<std::string, Case> all = {
      {"linear_column",
       {"  - {match: 'layer\\.weight', layout: [model, null]}\n"
        "  - {match: 'layer\\.bias', layout: [model]}\n",
        linear_torch, linear_planned}},
      {"linear_row", {"  - {match: 'layer\\.weight', layout: [null, model]}\n", linear_torch, linear_planned}},
      {"embedding_vocab", {"  - {match: 'layer\\.weight', layout: [model, null]}\n", embedding_torch, embedding_planned}},
      {"conv2d_out_channel",
       {"  - {match: 'layer\\.weight', layout: [model, null, null, null]}\n"
        "  - {match: 'layer\\.bias', layout: [model]}\n",
        conv_torch, conv_planned}},
      {"cross_entropy_vocab", {"  - {match: 'layer', layout: [null, model]}\n", ce_torch, ce_planned}},
      {"lstm_hidden",
       {"  - {match: 'layer\\.weight_.*', layout: [model, null]}\n"
        "  - {match: 'layer\\.bias_.*', layout: [model]}\n",
        lstm_torch, lstm_planned}},
      {"mha_heads",
       {"  - {match: 'layer\\.in_proj_weight', layout: [model, null]}\n"
        "  - {match: 'layer\\.in_proj_bias', layout: [model]}\n"
        "  - {match: 'layer\\.out_proj\\.weight', layout: [null, model], input: sharded}\n",
        mha_torch, mha_planned}},
  };
  return all;
}

// ---------------------------------------------------------------- harness

void math_threads(int n) { shardplan::set_num_threads(n); }

void BM_TorchNN(benchmark::State& state, const std::string& name, int threads) {
  math_threads(threads);
  auto step = cases().at(name).torch_nn();
  for (int i = 0; i < 3; ++i) step();
  for (auto _ : state) step();
  math_threads(1);
}

void BM_Shardplan(benchmark::State& state, const std::string& name, const std::string& backend, int world) {
  const auto& c = cases().at(name);
  const auto plan = shardplan::parse_plan("version: 1\nmesh: {model: auto}\nrules:\n" + c.rules, name + ".yaml");
  Lockstep steps;
  try {
    shardplan::run_ranks_in_threads(
        world,
        [&](World& w) {
          auto step = c.planned(w, plan);
          for (int i = 0; i < 3; ++i) step();
          if (w.rank() == 0) {
            for (auto _ : state) {
              steps.post();
              step();
            }
            steps.finish();
          } else {
            for (int64_t i = 0; steps.wait_for(i); ++i) step();
          }
        },
        backend);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// Process mode: this process is one rank of the launcher's world. Every rank
// runs the same rows with the same fixed iteration count (no lockstep can
// span processes cheaply), so their collectives pair up.
void BM_ShardplanProcs(benchmark::State& state, const std::string& name, World* w) {
  const auto& c = cases().at(name);
  const auto plan = shardplan::parse_plan("version: 1\nmesh: {model: auto}\nrules:\n" + c.rules, name + ".yaml");
  auto step = c.planned(*w, plan);
  for (int i = 0; i < 3; ++i) step();
  w->comm().barrier();
  for (auto _ : state) step();
  w->comm().barrier();
}

// GELU's forward and backward at the example GPT's MLP activation on one
// rank ([8, 64, 512]: `{data: 2}`'s local batch, or TP=2's half of the
// hidden width at batch 16): at::gelu against shardplan::gelu (nn/gelu.h),
// which computes erf once per element instead of twice (float64; float32
// is at::gelu on both rows).
void BM_Gelu(benchmark::State& state, bool ours, at::ScalarType dtype) {
  const at::Tensor x0 = at::randn({8, 64, 512}, dtype), dy = at::randn({8, 64, 512}, dtype);
  auto step = [&] {
    const at::Tensor x = x0.detach().requires_grad_(true);
    (ours ? shardplan::gelu(x) : at::gelu(x)).backward(dy);
  };
  for (int i = 0; i < 3; ++i) step();
  for (auto _ : state) step();
}

void register_procs(World& w, int64_t iters) {
  for (const auto& kv : cases()) {
    const std::string& name = kv.first;
    // The baseline only on rank 0, while the others wait in the next row's
    // first collective (gloo waits without spinning).
    if (w.rank() == 0)
      benchmark::RegisterBenchmark(("torch_nn/" + name + "/threads:1").c_str(), BM_TorchNN, name, 1)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime()
          ->Iterations(iters);
    benchmark::RegisterBenchmark(
        ("shardplan/" + name + "/" + w.options().backend + "-procs/world:" + std::to_string(w.size())).c_str(),
        BM_ShardplanProcs, name, &w)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime()
        ->Iterations(iters);
  }
}

void register_all() {
  for (const at::ScalarType dtype : {at::kDouble, at::kFloat})
    for (bool ours : {false, true})
      benchmark::RegisterBenchmark((std::string("gelu/") + (ours ? "shardplan::gelu/" : "at::gelu/") +
                                    (dtype == at::kDouble ? "float64" : "float32")).c_str(),
                                   BM_Gelu, ours, dtype)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
  for (const auto& kv : cases()) {
    const std::string& name = kv.first;
    for (int threads : {1, 2})
      benchmark::RegisterBenchmark(("torch_nn/" + name + "/threads:" + std::to_string(threads)).c_str(), BM_TorchNN,
                                   name, threads)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    for (const std::string backend : {"local", "gloo"})
      for (int world : {1, 2})
        benchmark::RegisterBenchmark(("shardplan/" + name + "/" + backend + "/world:" + std::to_string(world)).c_str(),
                                     BM_Shardplan, name, backend, world)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  math_threads(1);
  std::shared_ptr<World> world;
  if (shardplan::WorldOptions::env_has_job()) {
    int64_t iters = 20;
    int kept = 1;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a.rfind("--iters=", 0) == 0) iters = shardplan::count_or_exit(argv[0], "--iters", a.substr(8), 1, 1000000000);
      else argv[kept++] = argv[i];
    }
    argc = kept;
    world = shardplan::init_world(shardplan::WorldOptions::from_env());
    if (world->rank() != 0) {
      // Rank 0 reports, to the console and to any --benchmark_out file.
      if (!std::freopen("/dev/null", "w", stdout)) return 1;
      kept = 1;
      for (int i = 1; i < argc; ++i)
        if (std::string(argv[i]).rfind("--benchmark_out", 0) != 0) argv[kept++] = argv[i];
      argc = kept;
    }
    register_procs(*world, iters);
  } else {
    register_all();
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
