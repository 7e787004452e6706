// Framework costs that are not the communication backends' (those have their
// own benchmarks): applying a plan to a large model, the autograd region ops
// at world size 1, and a column -> row tensor-parallel Linear pair per backend
// against the same pair unsharded. Figures and the command that produced them
// are in docs/BENCHMARKS.md.
//
// Every benchmark runs with one intra-op thread (see main): ranks are threads
// of this process, and two ranks each asking for both cores would measure the
// oversubscription, not the framework.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "shardplan/threads.h"
#include "shardplan/communicator.h"
#include "shardplan/mappings.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"
#include "../common/lockstep.h"

namespace {

using shardplan::World;

// Runs `fn` on n ranks as threads; a failure skips the benchmark with the
// error instead of aborting the whole run.
void on_ranks(benchmark::State& state, int n, const std::function<void(World&)>& fn,
              const std::string& backend = "local") {
  try {
    shardplan::run_ranks_in_threads(n, fn, backend);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// ---------------------------------------------------------------------------
// 1. Plan application on a model with 10,000 parameter tensors.

constexpr int kBlocks = 2500;  // x {fc1, fc2} x {weight, bias}

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t d, int64_t h) {
    fc1 = register_module("fc1", shardplan::nn::Linear(d, h));
    fc2 = register_module("fc2", shardplan::nn::Linear(h, d));
  }
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr};
};

struct BlockImpl : torch::nn::Module {
  BlockImpl() { mlp = register_module("mlp", std::make_shared<MlpImpl>(8, 16)); }
  std::shared_ptr<MlpImpl> mlp;
};

// Parameters are named like a transformer's: blocks.<i>.mlp.fc1.weight. The
// layers are tiny on purpose: the cost under test is per parameter, not per
// element.
struct DeepModel : torch::nn::Module {
  DeepModel() {
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < kBlocks; ++i) blocks->push_back(std::make_shared<BlockImpl>());
  }
  torch::nn::ModuleList blocks{nullptr};
};

const char* kDeepPlan = R"(version: 1
mesh: {model: auto}
rules:
  - match: 'blocks\.\d+\.mlp\.fc1\.weight'
    layout: [model, null]
    output: sharded
  - match: 'blocks\.\d+\.mlp\.fc1\.bias'
    layout: [model]
  - match: 'blocks\.\d+\.mlp\.fc2\.weight'
    layout: [null, model]
    input: sharded
  - match: 'blocks\.\d+\.mlp\.fc2\.bias'
    layout: [null]
)";

std::vector<shardplan::ParamInfo> param_infos(torch::nn::Module& m) {
  std::vector<shardplan::ParamInfo> out;
  for (const auto& p : m.named_parameters()) out.push_back({p.key(), p.value().sizes().vec()});
  return out;
}

void BM_PlanParse(benchmark::State& state) {
  for (auto _ : state) {
    auto plan = shardplan::parse_plan(kDeepPlan);
    benchmark::DoNotOptimize(plan);
  }
}
BENCHMARK(BM_PlanParse)->Unit(benchmark::kMicrosecond);

void BM_PlanAssign(benchmark::State& state) {
  const int world_size = static_cast<int>(state.range(0));
  const auto plan = shardplan::parse_plan(kDeepPlan);
  DeepModel model;
  const auto infos = param_infos(model);
  for (auto _ : state) {
    auto match = plan.assign(infos, world_size);
    benchmark::DoNotOptimize(match);
  }
  state.counters["params"] = static_cast<double>(infos.size());
}
BENCHMARK(BM_PlanAssign)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

// Everything parallelize does short of touching the model or communicating:
// collecting parameters, matching, grouping by module, the plugins' checks.
void BM_CheckPlan(benchmark::State& state) {
  const int world_size = static_cast<int>(state.range(0));
  const auto plan = shardplan::parse_plan(kDeepPlan);
  DeepModel model;
  for (auto _ : state) {
    auto report = shardplan::check_plan(model, plan, world_size);
    benchmark::DoNotOptimize(report);
  }
}
BENCHMARK(BM_CheckPlan)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

// The whole parallelize, timed on rank 0 from a barrier before to a barrier
// after (so at world size 2 it waits for the slower rank). parallelize shards
// in place, so every step gets a fresh model, built with the timer paused:
// weight initialisation is the model's cost, not the plan's.
void BM_Parallelize(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const auto plan = shardplan::parse_plan(kDeepPlan);
  Lockstep steps;
  on_ranks(state, n, [&](World& w) {
    // Untimed first application: loads the layer plugin and creates the
    // mesh's groups, which happen once per process and world.
    {
      DeepModel warm;
      shardplan::parallelize(warm, plan, w);
    }
    if (w.rank() == 0) {
      for (auto _ : state) {
        state.PauseTiming();
        auto model = std::make_unique<DeepModel>();
        steps.post();
        w.comm().barrier();
        state.ResumeTiming();
        auto report = shardplan::parallelize(*model, plan, w);
        w.comm().barrier();
        state.PauseTiming();
        benchmark::DoNotOptimize(report);
        model.reset();
        state.ResumeTiming();
      }
      steps.finish();
    } else {
      for (int64_t i = 0;; ++i) {
        auto model = std::make_unique<DeepModel>();  // built while rank 0 is paused too
        if (!steps.wait_for(i)) break;
        w.comm().barrier();
        shardplan::parallelize(*model, plan, w);
        w.comm().barrier();
      }
    }
  });
  state.counters["params"] = 4.0 * kBlocks;
}
BENCHMARK(BM_Parallelize)->ArgName("world")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---------------------------------------------------------------------------
// 2. Region ops at world size 1: every mapping should be the identity, with
// no autograd node, so it must cost what returning the tensor costs.

enum class Region { Identity, PlainAdd, CopyTo, ReduceFrom, GatherFrom };

World& solo_world() {
  static std::shared_ptr<World> world = [] {
    shardplan::WorldOptions o;
    o.backend = "local";
    o.backend_options = {"local_id=bench_framework_solo"};
    return shardplan::init_world(o);
  }();
  return *world;
}

at::Tensor region(Region op, const at::Tensor& x, shardplan::Communicator& g) {
  switch (op) {
    case Region::Identity: return x;
    case Region::PlainAdd: return x + 0;  // the cheapest op that makes an autograd node
    case Region::CopyTo: return shardplan::copy_to_group(x, g);
    case Region::ReduceFrom: return shardplan::reduce_from_group(x, g);
    case Region::GatherFrom: return shardplan::gather_from_group(x, g, -1);
  }
  return x;
}

void BM_RegionForward(benchmark::State& state, Region op) {
  auto& g = solo_world().comm();
  auto x = torch::randn({state.range(0), state.range(1)}, torch::requires_grad());
  for (auto _ : state) {
    at::Tensor y = region(op, x, g);
    benchmark::DoNotOptimize(y);
  }
}

// Forward, then backward through y.sum(): the sum and its backward are common
// to all variants, so differences between rows are the op's own cost.
void BM_RegionFwdBwd(benchmark::State& state, Region op) {
  auto& g = solo_world().comm();
  auto x = torch::randn({state.range(0), state.range(1)}, torch::requires_grad());
  for (auto _ : state) {
    at::Tensor y = region(op, x, g);
    y.sum().backward();
  }
  benchmark::DoNotOptimize(x.grad());
}

#define REGION_BENCH(fn, label, op) \
  BENCHMARK_CAPTURE(fn, label, op)->Args({8, 16})->Args({64, 256})->Unit(benchmark::kNanosecond)
REGION_BENCH(BM_RegionForward, identity, Region::Identity);
REGION_BENCH(BM_RegionForward, x_plus_0, Region::PlainAdd);
REGION_BENCH(BM_RegionForward, copy_to_group, Region::CopyTo);
REGION_BENCH(BM_RegionForward, reduce_from_group, Region::ReduceFrom);
REGION_BENCH(BM_RegionForward, gather_from_group, Region::GatherFrom);
REGION_BENCH(BM_RegionFwdBwd, identity, Region::Identity);
REGION_BENCH(BM_RegionFwdBwd, x_plus_0, Region::PlainAdd);
REGION_BENCH(BM_RegionFwdBwd, copy_to_group, Region::CopyTo);
REGION_BENCH(BM_RegionFwdBwd, reduce_from_group, Region::ReduceFrom);
REGION_BENCH(BM_RegionFwdBwd, gather_from_group, Region::GatherFrom);

// ---------------------------------------------------------------------------
// 3. The Megatron MLP pair, fc1 column-parallel with its output kept sharded,
// fc2 row-parallel on that shard: one all-reduce forward, one backward.

template <class L>
struct PairImpl : torch::nn::Module {
  PairImpl(int64_t d, int64_t h) {
    fc1 = register_module("fc1", L(d, h));
    fc2 = register_module("fc2", L(h, d));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2->forward(torch::relu(fc1->forward(x))); }
  L fc1{nullptr}, fc2{nullptr};
};

const char* kPairPlan = R"(version: 1
mesh: {model: auto}
rules:
  - match: 'fc1\.weight'
    layout: [model, null]
    output: sharded
  - match: 'fc1\.bias'
    layout: [model]
  - match: 'fc2\.weight'
    layout: [null, model]
    input: sharded
)";

// Deterministic and identical on every rank without a shared generator:
// ranks are threads, and the global generator's sequence would depend on
// which thread drew first.
at::Tensor input(int64_t batch, int64_t d) { return torch::linspace(-1.0, 1.0, batch * d).view({batch, d}); }

template <class M>
void train_step(M& model, const at::Tensor& x) {
  for (auto& p : model.parameters()) p.mutable_grad().reset();
  model.forward(x).sum().backward();
}

void BM_LinearPairUnsharded(benchmark::State& state) {
  const int64_t batch = state.range(0), d = state.range(1), h = state.range(2);
  PairImpl<torch::nn::Linear> model(d, h);
  const auto x = input(batch, d);
  for (int i = 0; i < 3; ++i) train_step(model, x);
  for (auto _ : state) train_step(model, x);
}

void BM_LinearPairTP(benchmark::State& state, const std::string& backend) {
  const int64_t batch = state.range(0), d = state.range(1), h = state.range(2);
  const auto plan = shardplan::parse_plan(kPairPlan);
  Lockstep steps;
  on_ranks(
      state, 2,
      [&](World& w) {
        PairImpl<shardplan::nn::Linear> model(d, h);
        shardplan::parallelize(model, plan, w);
        const auto x = input(batch, d);
        for (int i = 0; i < 3; ++i) train_step(model, x);
        if (w.rank() == 0) {
          for (auto _ : state) {
            steps.post();
            train_step(model, x);
          }
          steps.finish();
        } else {
          for (int64_t i = 0; steps.wait_for(i); ++i) train_step(model, x);
        }
      },
      backend);
}

#define PAIR_SIZES ->Args({32, 256, 1024})->Args({64, 1024, 4096})->ArgNames({"batch", "d", "h"})
BENCHMARK(BM_LinearPairUnsharded) PAIR_SIZES->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_LinearPairTP, local_2ranks, std::string("local"))
PAIR_SIZES->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_LinearPairTP, gloo_2ranks, std::string("gloo"))
PAIR_SIZES->Unit(benchmark::kMicrosecond)->UseRealTime();

void single_threaded_math() { shardplan::set_num_threads(1); }

}  // namespace

int main(int argc, char** argv) {
  single_threaded_math();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
