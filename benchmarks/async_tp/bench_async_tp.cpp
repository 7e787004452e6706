// Async tensor parallelism (issue 11's overlap benchmark): forward + backward
// of a column + row dense pair (x + fc2(gelu(fc1(x))), fc1 [4E, E]) under
// sequence parallelism, with the sequence gathers and reduce-scatters as
// collectives ("sync", overlap: none), over a ring ("ring"), a
// bidirectional ring ("bidir") and a feature-split ring ("split"), from
// latency-bound to compute-bound sizes.
//
//   bench_async_tp --threads 2                    # local backend, ranks as threads
//   shardplan launch -n 2 --backend gloo -- bench_async_tp
//   mpirun -n 2 bench_async_tp                    # Open MPI (backend mpi)
//
// Per size, the modes run in interleaved blocks, the order rotating each
// round, so machine noise hits them alike; medians over rounds, slowest rank.
// "comm" is the sync path's communication alone (all-gather [T/N, B, E] and
// reduce-scatter [T, B, E] forward, the same backward) on the same group, and
// the fraction of it hidden is (t_sync - t_mode) / t_comm: 100% when the
// ring takes no longer than the matmuls alone, negative when it loses.
// It checks what it measures: all three modes give the same output (1e-9).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace {

struct PairImpl : torch::nn::Cloneable<PairImpl> {
  explicit PairImpl(int64_t e = 8) : e(e) { reset(); }
  void reset() override {
    fc1 = register_module("fc1", shardplan::nn::Linear(e, 4 * e));
    fc2 = register_module("fc2", shardplan::nn::Linear(4 * e, e));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2->forward(torch::gelu(fc1->forward(x))); }
  int64_t e;
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Pair);

std::string plan_yaml(const std::string& overlap) {
  return "version: 1\nmesh: {model: auto}\nsequence_parallel: {dim: 0}\nrules:\n"
         "  - match: 'fc1\\.weight'\n    layout: [model, null]\n    output: sharded\n    overlap: " + overlap + "\n"
         "  - match: 'fc1\\.bias'\n    layout: [model]\n"
         "  - match: 'fc2\\.weight'\n    layout: [null, model]\n    input: sharded\n    overlap: " + overlap + "\n"
         "  - match: 'fc2\\.bias'\n    layout: [null]\n";
}

struct Size {
  int64_t tokens, embed;
};

struct Args {
  int threads = 0;  // > 0: ranks as threads on the local backend
  int rounds = 7;
  int steps = 3;
  std::vector<Size> sizes = {{256, 64}, {1024, 128}, {2048, 256}, {4096, 512}};
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw shardplan::Error(k + " needs a value");
      return argv[++i];
    };
    if (k == "--threads") {
      a.threads = std::stoi(next());
    } else if (k == "--rounds") {
      a.rounds = std::stoi(next());
    } else if (k == "--steps") {
      a.steps = std::stoi(next());
    } else if (k == "--sizes") {  // tokens x embed, e.g. 256x64,1024x128
      a.sizes.clear();
      std::stringstream s(next());
      std::string item;
      while (std::getline(s, item, ',')) {
        const auto x = item.find('x');
        if (x == std::string::npos) throw shardplan::Error("--sizes takes TOKENSxEMBED,..., got '" + item + "'");
        a.sizes.push_back({std::stoll(item.substr(0, x)), std::stoll(item.substr(x + 1))});
      }
    } else {
      throw shardplan::Error("unknown argument '" + k + "' (--threads N, --rounds N, --steps N, --sizes TxE,...)");
    }
  }
  return a;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run(shardplan::World& world, const Args& a) {
  const int n = world.size();
  const char* modes[] = {"none", "ring", "ring_bidirectional", "ring_split"};
  constexpr int kModes = 4;  // plus the communication alone
  if (world.rank() == 0) {
    std::printf("backend %s, %d ranks, median of %d rounds x %d steps (forward + backward), float32\n",
                world.comm().backend().c_str(), n, a.rounds, a.steps);
    std::printf("%8s %6s %10s %10s %10s %10s %10s %9s %9s %9s\n", "tokens", "embed", "sync ms", "ring ms",
                "bidir ms", "split ms", "comm ms", "hid ring", "hid bidir", "hid split");
  }
  for (const Size& sz : a.sizes) {
    torch::manual_seed(1);
    auto ref = Pair(sz.embed);
    std::vector<std::shared_ptr<PairImpl>> models;
    for (const char* m : modes) {
      models.push_back(std::dynamic_pointer_cast<PairImpl>(ref->clone()));
      shardplan::parallelize(*models.back(), shardplan::parse_plan(plan_yaml(m), "bench.yaml"), world);
    }
    auto group = world.groups(shardplan::Mesh({{"model", n}})).at("model");
    const int64_t t = sz.tokens / 4;  // batch 4
    torch::manual_seed(2);
    const auto x_full = torch::randn({t, 4, sz.embed});
    const auto x = x_full.chunk(n, 0)[world.rank()].contiguous();
    // Same answer from every mode.
    std::vector<torch::Tensor> outs;
    for (auto& m : models) outs.push_back(m->forward(x).detach());
    for (size_t k = 1; k < outs.size(); ++k)
      if (!outs[k].allclose(outs[0], 1e-4, 1e-5))
        throw shardplan::Error(std::string("mode ") + modes[k] + " gives other numbers than sync");
    auto step = [&](PairImpl& m) {
      auto xi = x.clone().requires_grad_(true);
      m.zero_grad();
      m.forward(xi).sum().backward();
    };
    auto comm_only = [&] {
      const auto part = torch::randn({t / n, 4, sz.embed});
      const auto whole = torch::randn({t, 4, sz.embed});
      for (int k = 0; k < 2; ++k) {  // forward and backward
        group->all_gather(part, 0);
        group->reduce_scatter(whole, 0);
      }
    };
    std::vector<std::vector<double>> times(kModes + 1);
    for (int round = 0; round < a.rounds; ++round)
      for (int j = 0; j <= kModes; ++j) {
        const int mode = (round + j) % (kModes + 1);
        world.comm().barrier();
        const double t0 = now();
        for (int s = 0; s < a.steps; ++s) mode < kModes ? step(*models[mode]) : comm_only();
        double dt = (now() - t0) / a.steps;
        // The slowest rank's time.
        auto v = torch::tensor({dt}, torch::kDouble);
        world.comm().all_reduce(v, shardplan::ReduceOp::Max);
        times[mode].push_back(v.item<double>());
      }
    const double sync = median(times[0]), ring = median(times[1]), bidir = median(times[2]),
                 split = median(times[3]), comm = median(times[kModes]);
    if (world.rank() == 0)
      std::printf("%8lld %6lld %10.3f %10.3f %10.3f %10.3f %10.3f %8.0f%% %8.0f%% %8.0f%%\n",
                  static_cast<long long>(sz.tokens), static_cast<long long>(sz.embed), sync * 1e3, ring * 1e3,
                  bidir * 1e3, split * 1e3, comm * 1e3, 100 * (sync - ring) / comm, 100 * (sync - bidir) / comm,
                  100 * (sync - split) / comm);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    if (a.threads > 0) {
      shardplan::run_ranks_in_threads(a.threads, [&](shardplan::World& w) { run(w, a); });
    } else {
      auto world = shardplan::init_world(shardplan::WorldOptions::from_env());
      run(*world, a);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_async_tp: error: %s\n", e.what());
    return 1;
  }
}
