// Load time of the Llama example's weights in three ways, in one run,
// repetitions interleaved and each starting at another mode, so that a noisy
// machine slows all alike:
//   mmap-slice    shard-on-load, load_weights (docs/WEIGHTS.md): each rank
//                 copies its slice straight out of the memory-mapped file;
//   tensor-whole  WeightsOptions::whole_then_slice: each tensor read whole
//                 into memory, then this rank's shard cut from it, one
//                 tensor at a time (a loader that cuts after reading);
//   file-whole    read_weights + relocate_state_dict + load_state_dict: the
//                 whole file read into memory, then every shard cut (what
//                 torch.load of a state dict, then slicing, does).
//
//   bench_llama_load --weights DIR [--plan plans/llama.yaml] [--ranks N] [--reps R]
//   shardplan launch -n N --backend gloo -- bench_llama_load --weights DIR --plan ...
//
// The model's shape comes from DIR's config.json, as train_model's
// --load-weights DIR. Per repetition: the slowest rank's time of each mode
// (a job waits for its last rank). Per rank: the process's peak resident
// memory during each load above what it held before it (models/memory.h;
// the heap is trimmed before each load, so memory an earlier load freed is
// not counted as already there). Ranks that are threads share one process:
// their memory figure is the process's, all of them together.
#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "models/hf_config.h"
#include "models/memory.h"
#include "models/model.h"
#include "models/options.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/weights.h"
#include "shardplan/world.h"

namespace se = shardplan::examples;

namespace {

struct Args {
  std::string weights, plan;
  int ranks = 1, reps = 7;
};

constexpr int kModes = 3;
const char* const kModeNames[kModes] = {"mmap-slice", "tensor-whole", "file-whole"};

void load(int mode, torch::nn::Module& model, const shardplan::ParallelReport& report, const std::string& path) {
  if (mode == 2) {
    shardplan::load_state_dict(model, shardplan::relocate_state_dict(shardplan::read_weights(path), report));
    return;
  }
  shardplan::WeightsOptions o;
  o.whole_then_slice = mode == 1;
  shardplan::load_weights(model, report, path, o);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_llama_load: %s\nusage: bench_llama_load --weights DIR [--plan PLAN.yaml] [--ranks N] "
               "[--reps R]\n(ranks as threads; or under shardplan launch, as processes)\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage("missing value for " + k);
    const std::string v = argv[++i];
    try {
      if (k == "--weights")
        a.weights = v;
      else if (k == "--plan")
        a.plan = v;
      else if (k == "--ranks")
        a.ranks = shardplan::count_option_int(k, v, 1, 4096);
      else if (k == "--reps")
        a.reps = shardplan::count_option_int(k, v, 1);
      else
        usage("unknown argument '" + k + "'");
    } catch (const shardplan::CountError& e) {
      usage(e.what());
    }
  }
  if (a.weights.empty()) usage("--weights DIR is required");
  if (a.ranks < 1 || a.reps < 1) usage("--ranks and --reps must be at least 1");
  return a;
}

// Every rank's values, [ranks, n], on every rank (each fills its row).
at::Tensor gather_rows(shardplan::World& world, const std::vector<double>& mine) {
  at::Tensor all = at::zeros({world.size(), static_cast<int64_t>(mine.size())}, at::kDouble);
  for (size_t i = 0; i < mine.size(); ++i) all[world.rank()][i] = mine[i];
  world.comm().all_reduce(all);
  return all;
}

std::mutex init_mutex;  // thread ranks: one model built at a time, same seed

void bench(const Args& a, shardplan::World& world, int ranks_in_process) {
  se::ModelHandle m;
  {
    std::lock_guard<std::mutex> lock(init_mutex);
    torch::manual_seed(0);
    m = se::make_model("llama", se::read_hf_config(se::find_hf_config(a.weights), "llama"));
  }
  int64_t model_bytes = 0, largest = 0;
  for (const auto& p : m.module->parameters()) {
    model_bytes += p.nbytes();
    largest = std::max<int64_t>(largest, p.nbytes());
  }
  shardplan::ParallelReport report;
  if (!a.plan.empty())
    report = shardplan::parallelize(*m.module, shardplan::load_plan(a.plan), world);
  else if (world.size() > 1)
    throw shardplan::Error("several ranks need --plan");
  int64_t shard_bytes = 0;
  for (const auto& p : m.module->parameters()) shard_bytes += p.nbytes();

  // Rep 0 loads each mode once untimed: the file into the page cache, the
  // first-touch costs of the parameters' pages out of the way.
  std::vector<double> secs[kModes], extra[kModes];
  for (int r = 0; r <= a.reps; ++r) {
    for (int k = 0; k < kModes; ++k) {
      const int mode = (k + r) % kModes;
      malloc_trim(0);  // per thread rank: each trims, the last one before the reset counts
      const se::ProcessMemory before = se::process_memory();
      double t = 0;
      const se::ProcessMemory after = se::peak_during(world, ranks_in_process, [&] {
        const auto t0 = std::chrono::steady_clock::now();
        load(mode, *m.module, report, a.weights);
        t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      });
      if (r == 0) continue;
      secs[mode].push_back(t);
      extra[mode].push_back(static_cast<double>(after.peak - before.rss));
    }
  }
  at::Tensor times[kModes], mem[kModes];
  for (int mode = 0; mode < kModes; ++mode) {
    times[mode] = gather_rows(world, secs[mode]);
    mem[mode] = gather_rows(world, extra[mode]);
  }
  if (world.rank() != 0) return;
  std::printf("bench_llama_load: %s, %s; %d rank(s) as %s; plan %s\n", a.weights.c_str(),
              m.model->config_str().c_str(), world.size(), ranks_in_process > 1 ? "threads" : "processes",
              a.plan.empty() ? "none" : a.plan.c_str());
  std::printf("model %s MiB, rank 0's parameters %s MiB, largest tensor %s MiB\n", se::mib(model_bytes).c_str(),
              se::mib(shard_bytes).c_str(), se::mib(largest).c_str());
  // Per rep the slowest rank's time; ratios to mmap-slice in the same rep.
  std::printf("%4s %12s %12s %12s   (ms, the slowest rank; ratios to mmap-slice)\n", "rep", kModeNames[0],
              kModeNames[1], kModeNames[2]);
  std::vector<double> slow[kModes], ratio[kModes];
  for (int r = 0; r < a.reps; ++r) {
    std::printf("%4d", r + 1);
    for (int mode = 0; mode < kModes; ++mode) {
      slow[mode].push_back(times[mode].select(1, r).max().item<double>() * 1e3);
      ratio[mode].push_back(slow[mode].back() / slow[0].back());
      std::printf(" %12.1f", slow[mode].back());
    }
    std::printf("   x%.2f x%.2f\n", ratio[1].back(), ratio[2].back());
  }
  std::printf("median");
  for (int mode = 0; mode < kModes; ++mode)
    std::printf("%s %s %.1f ms", mode ? "," : "", kModeNames[mode], median(slow[mode]));
  std::printf("; per-rep ratios to mmap-slice, median: x%.2f x%.2f\n", median(ratio[1]), median(ratio[2]));
  const int rows = ranks_in_process > 1 ? 1 : world.size();  // thread ranks: one process
  for (int rank = 0; rank < rows; ++rank) {
    std::printf("%s: peak RSS during a load above before it, median (MiB):",
                ranks_in_process > 1 ? "process" : ("rank " + std::to_string(rank)).c_str());
    for (int mode = 0; mode < kModes; ++mode) {
      std::vector<double> per;
      for (int r = 0; r < a.reps; ++r) per.push_back(mem[mode][rank][r].item<double>());
      std::printf(" %s %s%s", kModeNames[mode], se::mib(static_cast<int64_t>(median(per))).c_str(),
                  mode + 1 < kModes ? "," : "\n");
    }
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    if (shardplan::WorldOptions::env_has_job()) {
      auto world = shardplan::init_world(shardplan::WorldOptions::from_env());
      bench(a, *world, 1);
    } else {
      shardplan::run_ranks_in_threads(a.ranks, [&](shardplan::World& w) { bench(a, w, a.ranks); });
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_llama_load: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
