// Async tensor parallelism (issue 11's overlap benchmark): forward + backward
// under sequence parallelism with the sequence gathers and reduce-scatters as
// collectives ("sync", overlap: none), over a ring ("ring"), a bidirectional
// ring ("bidir") and a feature-split ring ("split"), from latency-bound to
// compute-bound sizes, of
//   --model pair  a column + row dense pair, x + fc2(gelu(fc1(x))), fc1 [4E, E]
//   --model gpt   the example GPT (examples/models/gpt.h, --layers blocks,
//                 heads of 64 (or more, whole per rank), MLP 4E, vocabulary
//                 a multiple of the ranks up to 256, batch 4, context
//                 tokens / 4) with its loss, under plans/gpt_sp.yaml's rules
//                 and plans/gpt_async.yaml's rings.
//
//   bench_async_tp --threads 2                    # local backend, ranks as threads
//   shardplan launch -n 2 --backend gloo -- bench_async_tp
//   mpirun -n 2 bench_async_tp                    # Open MPI (backend mpi)
//
// Per size, the modes run in interleaved blocks, the order rotating each
// round, so machine noise hits them alike; medians over rounds, slowest rank.
// "comm" is the sync path's sequence communication alone, replayed on the
// same group: per all-gather / reduce-scatter pair of the sync step ([T/N, B,
// E] gathered, [T, B, E] scattered; the pair has 2 per step, forward and
// backward, the GPT 2(2L + 1): attention and MLP of each block, embedding and
// head), and the fraction of it hidden is (t_sync - t_mode) / t_comm: 100%
// when the ring takes no longer than the matmuls alone, negative when it
// loses; "hid" from the medians, "pair" from the median of the per-round
// differences (each round runs every mode once, so drift between rounds
// cancels). It checks what it measures: all modes give the same output (1e-4),
// and the GPT's replay moves the bytes its sync step hands to the model axis
// (within the small all-reduces of LayerNorm gradients and the loss).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "models/model.h"
#include "shardplan/communicator.h"
#include "shardplan/count_option.h"
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

// plans/gpt_async.yaml with every ring replaced by `overlap`.
shardplan::Plan gpt_plan(const std::string& overlap) {
  std::ifstream f(SHARDPLAN_SOURCE_DIR "/plans/gpt_async.yaml");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  const std::string ring = "overlap: ring\n";
  if (text.find(ring) == std::string::npos) throw shardplan::Error("plans/gpt_async.yaml has no 'overlap: ring'");
  for (size_t at = text.find(ring); at != std::string::npos; at = text.find(ring, at + 1))
    text.replace(at, ring.size(), "overlap: " + overlap + "\n");
  return shardplan::parse_plan(text, "gpt_async.yaml (overlap: " + overlap + ")");
}

struct Size {
  int64_t tokens, embed;
};

struct Args {
  int threads = 0;  // > 0: ranks as threads on the local backend
  std::string model = "pair";
  int64_t layers = 2;
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
      a.threads = static_cast<int>(shardplan::count_or_exit(argv[0], k, next(), 1, 4096));
    } else if (k == "--model") {
      a.model = next();
      if (a.model != "pair" && a.model != "gpt") throw shardplan::Error("--model takes pair or gpt, got '" + a.model + "'");
    } else if (k == "--layers") {
      a.layers = shardplan::count_or_exit(argv[0], k, next(), 1, 1 << 20);
    } else if (k == "--rounds") {
      a.rounds = static_cast<int>(shardplan::count_or_exit(argv[0], k, next(), 1, INT_MAX));
    } else if (k == "--steps") {
      a.steps = static_cast<int>(shardplan::count_or_exit(argv[0], k, next(), 1, INT_MAX));
    } else if (k == "--sizes") {  // tokens x embed, e.g. 256x64,1024x128
      a.sizes.clear();
      std::stringstream s(next());
      std::string item;
      while (std::getline(s, item, ',')) {
        const auto x = item.find('x');
        if (x == std::string::npos) throw shardplan::Error("--sizes takes TOKENSxEMBED,..., got '" + item + "'");
        a.sizes.push_back({shardplan::count_or_exit(argv[0], k, item.substr(0, x), 1, 1 << 30),
                           shardplan::count_or_exit(argv[0], k, item.substr(x + 1), 1, 1 << 30)});
      }
    } else {
      throw shardplan::Error("unknown argument '" + k + "' (--threads N, --model pair|gpt, --layers N, --rounds N, --steps N, --sizes TxE,...)");
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

constexpr int kBatch = 4;

// One size's four models (one per mode) and how to run them.
struct Subject {
  std::vector<std::function<at::Tensor()>> forward;  // per mode: an output to compare
  std::vector<std::function<void()>> step;           // per mode: forward + backward
  int pairs = 2;                                     // gather / scatter pairs per sync step
  std::vector<std::shared_ptr<torch::nn::Module>> keep;
};

Subject pair_subject(shardplan::World& world, const Size& sz, const char* const* modes, int n_modes) {
  Subject s;
  torch::manual_seed(1);
  auto ref = Pair(sz.embed);
  const int n = world.size();
  torch::manual_seed(2);
  const auto x_full = torch::randn({sz.tokens / kBatch, kBatch, sz.embed});
  const auto x = x_full.chunk(n, 0)[world.rank()].contiguous();
  for (int k = 0; k < n_modes; ++k) {
    auto m = std::dynamic_pointer_cast<PairImpl>(ref->clone());
    shardplan::parallelize(*m, shardplan::parse_plan(plan_yaml(modes[k]), "bench.yaml"), world);
    s.keep.push_back(m);
    s.forward.push_back([m, x] { return m->forward(x).detach(); });
    s.step.push_back([m, x] {
      auto xi = x.clone().requires_grad_(true);
      m->zero_grad();
      m->forward(xi).sum().backward();
    });
  }
  return s;
}

Subject gpt_subject(shardplan::World& world, const Size& sz, const Args& a, const char* const* modes, int n_modes) {
  namespace ex = shardplan::examples;
  Subject s;
  // Heads of 64 where the axis divides them, else the fewest whole heads per rank.
  const int64_t context = sz.tokens / kBatch, n = world.size();
  int64_t heads = std::max<int64_t>(sz.embed / 64, n);
  while (heads <= sz.embed && (heads % n != 0 || sz.embed % heads != 0)) ++heads;
  if (heads > sz.embed)
    throw shardplan::Error("--model gpt: no number of heads divides embed " + std::to_string(sz.embed) +
                           " and the " + std::to_string(n) + " ranks");
  torch::manual_seed(1);
  const int64_t vocab = n * (256 / n);  // split by the head
  auto handle = ex::make_model("gpt", ex::parse_overrides("vocab=" + std::to_string(vocab) +
                                                          ",context=" + std::to_string(context) +
                                                          ",embed=" + std::to_string(sz.embed) +
                                                          ",heads=" + std::to_string(heads) +
                                                          ",layers=" + std::to_string(a.layers) +
                                                          ",mlp=" + std::to_string(4 * sz.embed)));
  torch::manual_seed(2);
  const ex::Batch batch{torch::randint(vocab, {kBatch, context}, torch::kLong),
                        torch::randint(vocab, {kBatch, context}, torch::kLong)};
  for (int k = 0; k < n_modes; ++k) {
    auto module = handle.module->clone();
    ex::ExampleModel* model = ex::as_example(module).model;
    shardplan::parallelize(*module, gpt_plan(modes[k]), world);
    s.keep.push_back(module);
    s.forward.push_back([model, batch] { return model->loss(batch).detach(); });
    s.step.push_back([module, model, batch] {
      module->zero_grad();
      model->loss(batch).backward();
    });
  }
  s.pairs = static_cast<int>(2 * (2 * a.layers + 1));
  return s;
}

void run(shardplan::World& world, const Args& a) {
  const int n = world.size();
  const char* modes[] = {"none", "ring", "ring_bidirectional", "ring_split"};
  constexpr int kModes = 4;  // plus the communication alone
  if (world.rank() == 0) {
    std::printf("backend %s, %d ranks, %s, median of %d rounds x %d steps (forward + backward), float32\n",
                world.comm().backend().c_str(), n,
                a.model == "gpt" ? ("GPT, " + std::to_string(a.layers) + " blocks").c_str() : "dense pair",
                a.rounds, a.steps);
    std::printf("%8s %6s %10s %10s %10s %10s %10s %9s %9s %9s %9s %9s %9s\n", "tokens", "embed", "sync ms",
                "ring ms", "bidir ms", "split ms", "comm ms", "hid ring", "hid bidir", "hid split", "pair ring",
                "pair bidir", "pair split");
  }
  auto group = world.groups(shardplan::Mesh({{"model", n}})).at("model");
  for (const Size& sz : a.sizes) {
    Subject subject = a.model == "gpt" ? gpt_subject(world, sz, a, modes, kModes) : pair_subject(world, sz, modes, kModes);
    const int64_t t = sz.tokens / kBatch;
    // Same answer from every mode.
    std::vector<torch::Tensor> outs;
    for (auto& f : subject.forward) outs.push_back(f());
    for (size_t k = 1; k < outs.size(); ++k)
      if (!outs[k].allclose(outs[0], 1e-4, 1e-5))
        throw shardplan::Error(std::string("mode ") + modes[k] + " gives other numbers than sync");
    const auto part = torch::randn({t / n, kBatch, sz.embed});
    const auto whole = torch::randn({t, kBatch, sz.embed});
    auto comm_only = [&] {
      for (int k = 0; k < subject.pairs; ++k) {
        group->all_gather(part, 0);
        group->reduce_scatter(whole, 0);
      }
    };
    // What the replay stands for: the bytes the sync step hands to the model axis.
    group->reset_stats();
    subject.step[0]();
    const double sync_bytes = static_cast<double>(group->stats().bytes);
    group->reset_stats();
    comm_only();
    const double replay_bytes = static_cast<double>(group->stats().bytes);
    if (a.model == "gpt" && std::abs(replay_bytes - sync_bytes) > 0.05 * sync_bytes)
      throw shardplan::Error("the communication replay moves " + std::to_string(replay_bytes) +
                             " bytes, the sync step " + std::to_string(sync_bytes));
    std::vector<std::vector<double>> times(kModes + 1);
    for (int round = 0; round < a.rounds; ++round)
      for (int j = 0; j <= kModes; ++j) {
        const int mode = (round + j) % (kModes + 1);
        world.comm().barrier();
        const double t0 = now();
        for (int s = 0; s < a.steps; ++s) mode < kModes ? subject.step[mode]() : comm_only();
        double dt = (now() - t0) / a.steps;
        // The slowest rank's time.
        auto v = torch::tensor({dt}, torch::kDouble);
        world.comm().all_reduce(v, shardplan::ReduceOp::Max);
        times[mode].push_back(v.item<double>());
      }
    const double sync = median(times[0]), ring = median(times[1]), bidir = median(times[2]),
                 split = median(times[3]), comm = median(times[kModes]);
    auto paired = [&](int mode) {
      std::vector<double> d;
      for (size_t r = 0; r < times[0].size(); ++r) d.push_back(times[0][r] - times[mode][r]);
      return 100 * median(d) / comm;
    };
    if (world.rank() == 0)
      std::printf("%8lld %6lld %10.3f %10.3f %10.3f %10.3f %10.3f %8.0f%% %8.0f%% %8.0f%% %8.0f%% %8.0f%% %8.0f%%\n",
                  static_cast<long long>(sz.tokens), static_cast<long long>(sz.embed), sync * 1e3, ring * 1e3,
                  bidir * 1e3, split * 1e3, comm * 1e3, 100 * (sync - ring) / comm, 100 * (sync - bidir) / comm,
                  100 * (sync - split) / comm, paired(1), paired(2), paired(3));
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
