// Activation recomputation (the plan's `recompute:`): activation bytes kept
// for backward per rank, and the time of one forward + backward, of the
// example GPT under plans/gpt.yaml and the example Llama under
// plans/llama.yaml, at 1, 2 and 4 ranks (threads, local backend), without
// recomputation, with every block recomputed (full) and with attention's
// core recomputed (selective):
//
//   bench_recompute [--model gpt|llama|both] [--batch 8] [--ranks 1,2,4] [--reps 5]
//                   [--gpt K=V,...] [--llama K=V,...] [--profile N]
//
// "kept" is what is live after forward and the loss minus what was live
// before (exact, through benchmarks/common/counting_allocator.h; the largest
// over ranks). "per block" is kept at the configured layers minus kept with
// one layer fewer: one block's share, what the target "full keeps at most a
// third of no recomputation for a block" is about. "step" is the median over
// --reps of rank 0's forward + backward, milliseconds, the modes timed in
// turn within each repetition (their order rotated from one repetition to
// the next); "vs none" is the median over repetitions of a mode's step over
// none's in the same repetition, and "quartiles" the spread of that ratio:
// on a shared machine the load moves both steps of one repetition alike, so
// the ratio is steadier than either time. --profile N then profiles N more
// steps of each mode on rank 0 (libtorch's legacy autograd profiler) and
// prints each op's self time per step, where a mode's extra time goes.
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "../common/counting_allocator.h"
#include "models/model.h"
#include "shardplan/count_option.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/random.h"
#include "shardplan/world.h"

namespace {

namespace ex = shardplan::examples;
using counting_allocator::Charge;
using counting_allocator::tl_charge;

struct Args {
  std::string model = "both";
  std::string gpt = "context=256,embed=256,heads=8,layers=2,mlp=1024,dropout=0.1";
  std::string llama = "context=256,embed=256,heads=8,kv_heads=4,layers=2,mlp=704";
  int64_t batch = 8;
  int reps = 5;
  int profile = 0;  // profiled steps per mode after the timed ones
  std::vector<int> ranks = {1, 2, 4};
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw shardplan::Error(k + " needs a value");
      return argv[++i];
    };
    if (k == "--model") {
      a.model = next();
      if (a.model != "gpt" && a.model != "llama" && a.model != "both")
        throw shardplan::Error("--model must be gpt, llama or both");
    } else if (k == "--gpt") {
      a.gpt = next();
    } else if (k == "--llama") {
      a.llama = next();
    } else if (k == "--batch") {
      a.batch = shardplan::count_or_exit(argv[0], k, next(), 1, INT_MAX);
    } else if (k == "--reps") {
      a.reps = static_cast<int>(shardplan::count_or_exit(argv[0], k, next(), 1, 1000));
    } else if (k == "--profile") {
      a.profile = static_cast<int>(shardplan::count_or_exit(argv[0], k, next(), 0, 1000));
    } else if (k == "--ranks") {
      a.ranks.clear();
      std::stringstream s(next());
      std::string item;
      while (std::getline(s, item, ','))
        a.ranks.push_back(static_cast<int>(shardplan::count_or_exit(argv[0], k, item, 1, 4096)));
    } else {
      throw shardplan::Error("unknown argument '" + k +
                             "' (--model gpt|llama|both, --gpt K=V,..., --llama K=V,..., --batch N, --reps N, "
                             "--ranks 1,2,4, --profile N)");
    }
  }
  return a;
}

struct Result {
  int64_t kept = 0;  // the largest over ranks
  double step_ms = 0;
  double ratio = 0, ratio_q1 = 0, ratio_q3 = 0;  // per repetition, step / none's step
  std::map<std::string, double> op_ms;            // --profile: self ms per step, per op
};

namespace prof = torch::autograd::profiler;

// Adds each op's self time (its time minus its children's), ms / steps.
void add_self_times(const prof::thread_event_lists& lists, int steps, std::map<std::string, double>& out) {
  for (const auto& list : lists) {
    std::vector<std::pair<const prof::LegacyEvent*, double>> open;  // with its children's time
    for (const auto& e : list) {
      if (e.kind() == prof::EventKind::PushRange) {
        open.emplace_back(&e, 0.0);
      } else if (e.kind() == prof::EventKind::PopRange && !open.empty()) {
        const auto top = open.back();
        open.pop_back();
        const double ms = top.first->cpuElapsedUs(e) / 1000.0;
        out[top.first->name()] += (ms - top.second) / steps;
        if (!open.empty()) open.back().second += ms;
      }
    }
  }
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// One world of `ranks` threads; per plan a clone of `ref`, sharded by it.
// Kept bytes of the first forward per plan; then `reps` rounds, each timing
// one forward + backward of every plan in turn, so that the load of the
// machine falls on every plan alike (the medians are compared).
std::vector<Result> measure(const std::shared_ptr<torch::nn::Module>& ref, const std::vector<shardplan::Plan>& plans,
                            int ranks, const ex::Batch& batch, int reps, int profile) {
  std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> replicas(plans.size());
  for (auto& per_plan : replicas)
    for (int r = 0; r < ranks; ++r) per_plan.push_back(ref->clone());
  std::vector<Result> res(plans.size());
  std::mutex mu;
  shardplan::run_ranks_in_threads(ranks, [&](shardplan::World& w) {
    std::vector<ex::ExampleModel*> models;
    std::vector<std::shared_ptr<shardplan::RngTracker>> trackers;
    for (size_t i = 0; i < plans.size(); ++i) {
      auto& module = replicas[i][w.rank()];
      models.push_back(ex::as_example(module).model);
      const auto report = shardplan::parallelize(*module, plans[i], w);
      trackers.push_back(shardplan::manual_seed(w, 5, report.mesh));
    }
    std::vector<int64_t> kept(plans.size());
    std::vector<std::vector<double>> ms(plans.size());
    // Never freed: blocks charged here (the gradients) are released after
    // this thread is gone, and credit their charge then.
    std::vector<Charge*> charges;
    for (size_t i = 0; i < plans.size(); ++i) charges.push_back(new Charge);
    for (int rep = -1; rep < reps + profile; ++rep)
      for (size_t k = 0; k < plans.size(); ++k) {
        const size_t i = (k + static_cast<size_t>(std::max(rep, 0))) % plans.size();
        const bool profiled = rep >= reps && w.rank() == 0;
        if (profiled) prof::enableProfilerLegacy(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU));
        shardplan::RngTrackerScope scope(trackers[i]);
        tl_charge = charges[i];
        const auto t0 = std::chrono::steady_clock::now();
        const int64_t before = charges[i]->live;
        at::Tensor loss = models[i]->loss(batch);
        if (rep < 0) kept[i] = charges[i]->live - before;
        loss.backward();
        loss.reset();
        tl_charge = nullptr;
        if (profiled) add_self_times(prof::disableProfilerLegacy(), profile, res[i].op_ms);
        if (rep >= 0 && rep < reps)
          ms[i].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < plans.size(); ++i) {
      res[i].kept = std::max(res[i].kept, kept[i]);
      if (w.rank() != 0 || ms[i].empty()) continue;
      std::vector<double> ratios;
      for (size_t r = 0; r < ms[i].size(); ++r) ratios.push_back(ms[i][r] / ms[0][r]);
      res[i].step_ms = quantile(ms[i], 0.5);
      res[i].ratio = quantile(ratios, 0.5);
      res[i].ratio_q1 = quantile(ratios, 0.25);
      res[i].ratio_q3 = quantile(ratios, 0.75);
    }
  });
  return res;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw shardplan::Error("cannot read " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::shared_ptr<torch::nn::Module> build(const std::string& name, ex::Overrides config, int64_t layers) {
  config["layers"] = std::to_string(layers);
  torch::manual_seed(1);
  return ex::make_model(name, config).module;
}

// Ops by the time they take in none and selective together; those under
// 0.5 ms per step in every mode left out.
void print_profile(int ranks, const std::vector<std::pair<std::string, std::string>>& modes,
                   const std::vector<Result>& res) {
  std::map<std::string, double> total;
  for (const Result& r : res)
    for (const auto& kv : r.op_ms) total[kv.first] = std::max(total[kv.first], kv.second);
  std::vector<std::pair<double, std::string>> order;
  for (const auto& kv : total)
    if (kv.second >= 0.5) order.emplace_back(-(res[0].op_ms.count(kv.first) ? res[0].op_ms.at(kv.first) : 0) - kv.second, kv.first);
  std::sort(order.begin(), order.end());
  std::printf("  %d ranks, rank 0, self ms per step:", ranks);
  for (const auto& m : modes) std::printf(" %10s", m.first.c_str());
  std::printf("  op\n");
  for (const auto& o : order) {
    std::printf("  %31s", "");
    for (const Result& r : res) std::printf(" %10.1f", r.op_ms.count(o.second) ? r.op_ms.at(o.second) : 0.0);
    std::printf("  %s\n", o.second.c_str());
  }
}

void bench(const std::string& name, const std::string& config_text, const Args& a) {
  const ex::Overrides config = ex::parse_overrides(config_text);
  const int64_t layers = config.count("layers") ? std::stoll(config.at("layers")) : 2;
  if (layers < 2) throw shardplan::Error("--" + name + ": layers must be at least 2 (per block = L minus L-1 layers)");
  auto full_model = build(name, config, layers), smaller = build(name, config, layers - 1);
  const int64_t context = std::stoll(config.count("context") ? config.at("context") : "64");
  const int64_t embed = std::stoll(config.count("embed") ? config.at("embed") : "128");
  torch::manual_seed(2);
  const ex::Batch batch{torch::randint(256, {a.batch, context}, torch::kLong),
                        torch::randint(256, {a.batch, context}, torch::kLong)};
  const std::string plan_path = SHARDPLAN_SOURCE_DIR "/plans/" + name + ".yaml";
  const std::string blocks = name == "gpt" ? "blocks\\.\\d+" : "model\\.layers\\.\\d+";
  const std::string attn = name == "gpt" ? "blocks\\.\\d+\\.attn" : "model\\.layers\\.\\d+\\.self_attn";
  const std::vector<std::pair<std::string, std::string>> modes = {
      {"none", ""}, {"full", "['" + blocks + "']"}, {"selective", "[{module: '" + attn + "', mode: selective}]"}};
  const double tbe = static_cast<double>(a.batch * context * embed * 4);
  std::printf("\nmodel %s: %s; plans/%s.yaml; batch %lld; float32; one [T, B, E] activation = %.0f bytes\n",
              name.c_str(), config_text.c_str(), name.c_str(), static_cast<long long>(a.batch), tbe);
  std::printf("%-6s %-10s %14s %10s %14s %10s %9s %10s %9s %13s\n", "ranks", "recompute", "kept/rank", "x[T,B,E]",
              "per block", "x[T,B,E]", "vs none", "step ms", "vs none", "quartiles");
  std::vector<shardplan::Plan> plans;
  for (const auto& mode : modes) {
    const std::string text = read(plan_path) + (mode.second.empty() ? "" : "\nrecompute: " + mode.second + "\n");
    plans.push_back(shardplan::parse_plan(text, plan_path));
  }
  for (int n : a.ranks) {
    const std::vector<Result> all = measure(full_model, plans, n, batch, a.reps, a.profile);
    const std::vector<Result> less = measure(smaller, plans, n, batch, 0, 0);
    for (size_t i = 0; i < modes.size(); ++i) {
      const int64_t block = all[i].kept - less[i].kept, none_block = all[0].kept - less[0].kept;
      std::printf("%-6d %-10s %14lld %10.2f %14lld %10.2f %9.2f %10.1f %9.3f %6.3f-%.3f\n", n, modes[i].first.c_str(),
                  static_cast<long long>(all[i].kept), all[i].kept / tbe, static_cast<long long>(block), block / tbe,
                  static_cast<double>(block) / static_cast<double>(none_block), all[i].step_ms, all[i].ratio,
                  all[i].ratio_q1, all[i].ratio_q3);
    }
    if (a.profile > 0) print_profile(n, modes, all);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    c10::SetAllocator(c10::DeviceType::CPU, &counting_allocator::counting, /*priority=*/255);
    if (a.model != "llama") bench("gpt", a.gpt, a);
    if (a.model != "gpt") bench("llama", a.llama, a);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_recompute: error: %s\n", e.what());
    return 1;
  }
}
