// Data parallelism over the batch axis on the example GPT (issue 10's
// benchmark): training-step time with the gradient sync overlapped with
// backward ("on"), the same sync started only after backward ("off"), no
// gradient sync at all ("none": the step without DataParallel::finish, a
// lower bound that trains nothing useful, since the replicas drift), and
// ZeRO-1 ("zero"); with --modes z3,z3np, ZeRO-3 with its all-gathers
// prefetched ("z3") and not ("z3np": SHARDPLAN_ZERO3_PREFETCH=0, each gate
// waits for its whole gather). Every mode, like train_gpt, averages the loss over the
// data ranks once per step (8 bytes). Run under the launcher, one process
// per rank:
//
//   shardplan launch -n 2 --backend gloo -- bench_dp_step --plan plans/data_parallel.yaml
//   shardplan launch -n 4 --backend gloo -- bench_dp_step --plan plans/gpt_2d.yaml
//
// The modes run as interleaved blocks of steps in one process group, the
// order rotating each round, every block from the same weights and batches,
// so machine noise hits them alike. Reported (docs/BENCHMARKS.md):
// - step, backward and finish() wait times, median over rounds, slowest rank;
// - the fraction of the sync hidden behind backward,
//   (t_off - t_on) / (t_off - t_none), from the medians and paired per round;
// - bytes per step on the batch axis: what DataParallel handed to the
//   Communicator (its counters), and what the process actually wrote to its
//   sockets (/proc/self/io wchar, which counts gloo TCP transport writes),
//   "on" minus "none", which leaves the model axis' traffic out, against the
//   ring all-reduce's minimum 2 (D-1)/D x gradient bytes;
// - ZeRO-1 optimizer state bytes per rank against the unsharded optimizer's;
// - ZeRO-3's all-gathers per step and the gates' wait for them: without
//   prefetch the wait is the gathers' whole time, so 1 - wait(z3)/wait(z3np)
//   is the share of it hidden behind compute.
// It also checks what it measures: "on" and "off" must give bit-identical
// losses, and the replicas must agree after every synchronised block.
//
// Like the example drivers, it has glibc keep freed memory in the heap
// (examples/models/heap.h): with glibc's defaults every step page-faults its
// large tensors in afresh, ~40 % of the step on the 2-core machine, and more
// for a mode that allocates more ("none" allocates the gradients that
// DataParallel keeps in its buckets), which made "none" no lower bound.
// --system-malloc 1 leaves glibc's defaults, to see the difference.
#include <time.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "models/corpus.h"
#include "models/heap.h"
#include "models/model.h"
#include "shardplan/count_option.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"
#include "shardplan/zero_optimizer.h"

namespace {

using shardplan::examples::Batch;

struct Args {
  std::string plan = "plans/data_parallel.yaml";
  std::string config = "embed=256,heads=8,layers=4,mlp=1024";
  int64_t batch = 16;  // global
  int steps = 3;       // per timed block
  int rounds = 7;
  double bucket_mb = -1;  // -1: the plan's
  std::vector<std::string> modes = {"on", "off", "none", "zero"};
  bool check = false;  // fail unless the bytes are what they should be (the smoke test)
  bool system_malloc = false;
};

[[noreturn]] void usage(const char* program, const std::string& why) {
  std::fprintf(stderr,
               "%s: %s\nusage (under `shardplan launch -n N --backend gloo --`): %s [--plan PLAN.yaml]\n"
               "       [--config KEY=VALUE,...] [--batch GLOBAL] [--steps PER_BLOCK] [--rounds N]\n"
               "       [--bucket-mb X] [--modes on,off,none,zero,z3,z3np] [--check 1] [--system-malloc 1]\n"
               "--check 1 fails the run unless the bytes per step and ZeRO-1's optimizer bytes are the\n"
               "expected ones (timings are reported, never checked)\n",
               program, why.c_str(), program);
  std::exit(2);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage(argv[0], "missing value for " + k);
    const std::string v = argv[++i];
    try {
      if (k == "--plan") a.plan = v;
      else if (k == "--config") a.config = v;
      else if (k == "--batch") a.batch = shardplan::count_option(k, v, 1, INT_MAX);
      else if (k == "--steps") a.steps = shardplan::count_option_int(k, v, 1);
      else if (k == "--rounds") a.rounds = shardplan::count_option_int(k, v, 1);
      else if (k == "--bucket-mb") a.bucket_mb = std::stod(v);
      else if (k == "--modes") a.modes = split_list(v);
      else if (k == "--check") a.check = shardplan::count_option_int(k, v, 0, 1) != 0;
      else if (k == "--system-malloc") a.system_malloc = shardplan::count_option_int(k, v, 0, 1) != 0;
      else usage(argv[0], "unknown argument '" + k + "'");
    } catch (const shardplan::CountError& e) {
      usage(argv[0], e.what());
    } catch (const std::logic_error&) {
      usage(argv[0], "bad value for " + k);
    }
  }
  for (const auto& m : a.modes)
    if (m != "on" && m != "off" && m != "none" && m != "zero" && m != "z3" && m != "z3np") usage(argv[0], "unknown mode '" + m + "'");
  if (a.steps < 1 || a.rounds < 1 || a.batch < 1) usage(argv[0], "--steps, --rounds and --batch must be positive");
  return a;
}

// Bytes this process (every thread) has passed to write-family system calls:
// with nothing else written during a block, its sockets' traffic.
int64_t written_bytes() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value)
    if (key == "wchar:") return value;
  return -1;
}

// CPU time of the whole process: the compute thread, gloo's worker and its
// transport's thread. A sync that costs as much CPU as wall time cannot hide
// behind a backward that already keeps every core busy.
double process_cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Block {
  double step_ms = 0, backward_ms = 0, wait_ms = 0;
  double cpu_ms = 0;         // per step, CPU time of every thread of the process
  double group_bytes = 0;    // per step, handed to the batch axis' Communicator
  double written = 0;        // per step, written to sockets by this process
  double gathers = 0, prefetched = 0, gather_wait_ms = 0;  // per step, ZeRO-3's
  double peak_whole_mb = 0;  // ZeRO-3: the most parameter bytes whole or arriving at once
  std::vector<double> losses;
};

struct Series {
  std::vector<Block> blocks;  // one per round
  int64_t state_bytes = 0;    // optimizer state after the block
};

class Bench {
 public:
  Bench(const Args& a, shardplan::World& world) : a_(a), world_(world) {
    torch::manual_seed(0);
    m_ = shardplan::examples::make_model("gpt", shardplan::examples::parse_overrides(a.config));
    plan_ = shardplan::load_plan(a.plan);
    if (a.bucket_mb > 0) {
      plan_.data_parallel.bucket_bytes = static_cast<int64_t>(a.bucket_mb * 1024 * 1024);
      plan_.data_parallel.bucket_mb = std::to_string(a.bucket_mb);
    }
    report_ = shardplan::parallelize(*m_.module, plan_, world);
    for (const auto& p : m_.module->parameters()) initial_.push_back(p.detach().clone());
    // train_gpt's data: the byte-level corpus shipped in examples/data.
    const shardplan::examples::Corpus corpus(shardplan::examples::default_corpus_path());
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
    for (int i = 0; i < a.steps + 1; ++i) batches_.push_back(m_.model->sample(gen, a.batch, &corpus));
  }

  shardplan::DataParallel probe() {
    restore();
    return shardplan::DataParallel(*m_.module, report_, plan_, world_);
  }
  std::string config() const { return m_.model->config_str(); }
  const shardplan::ParallelReport& report() const { return report_; }

  // The initial weights, new storage: a ZeRO-3 block left each parameter a
  // broadcast NaN (its slice lived in that DataParallel).
  void restore() {
    torch::NoGradGuard no_grad;
    auto params = m_.module->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].set_data(initial_[i].clone());
    // The last block's gradients may live in its DataParallel's buckets.
    for (auto& p : params) p.mutable_grad().reset();
  }

  Block run(const std::string& mode, Series& series) {
    restore();
    shardplan::Plan plan = plan_;
    const bool z3 = mode == "z3" || mode == "z3np";
    plan.data_parallel.overlap = mode != "off" && mode != "none";
    plan.data_parallel.zero = mode == "zero" ? 1 : z3 ? 3 : 0;
    // Read when the DataParallel is made.
    setenv("SHARDPLAN_ZERO3_PREFETCH", mode == "z3np" ? "0" : "1", 1);
    shardplan::DataParallel dp(*m_.module, report_, plan, world_);
    const bool sync = mode != "none";
    auto make = [](std::vector<at::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
      return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-3));
    };
    std::unique_ptr<torch::optim::Optimizer> opt;
    std::unique_ptr<shardplan::ZeroOptimizer> zero;
    if (plan.data_parallel.zero)
      zero = std::make_unique<shardplan::ZeroOptimizer>(dp, make);
    else
      opt = make(m_.module->parameters());

    std::vector<Batch> local;
    for (const auto& b : batches_) local.push_back({dp.local_batch(b.input), dp.local_batch(b.target)});
    Block out;
    double backward = 0, wait = 0;
    auto step = [&](const Batch& b) {
      if (zero)
        zero->zero_grad();
      else
        opt->zero_grad();
      at::Tensor loss = m_.model->loss(b);
      const auto t0 = std::chrono::steady_clock::now();
      if (sync) {
        loss.backward();
      } else {
        // The end of a backward completes the averaging by itself (autograd's
        // callback) unless under NoSync, DDP's no_sync(): without it "none"
        // synchronised like "off" and the hidden fraction compared the sync
        // with itself.
        shardplan::DataParallel::NoSync local_only(dp);
        loss.backward();
      }
      backward += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (sync) {
        dp.finish();
        wait += dp.last_wait_seconds() * 1e3;
      }
      if (zero)
        zero->step();
      else
        opt->step();
      // The global batch's loss, as train_gpt prints it: every mode, "none"
      // too, meets the other data ranks once per step, so all of them wait
      // for the slowest rank and sleep alike; off - none is then the
      // gradients' sync, not the ranks' skew or the scheduler's favour
      // for ranks that sleep.
      return dp.average(loss.item<double>());
    };
    step(local.back());  // warm-up: buffers, the optimizer's state
    backward = wait = 0;
    world_.comm().barrier();
    shardplan::Communicator* group = dp.group();
    const uint64_t g0 = group ? group->stats().bytes : 0;
    const int64_t w0 = written_bytes();
    const double c0 = process_cpu_ms();
    const shardplan::DataParallel::GatherStats s0 = dp.gather_stats();
    std::vector<double> losses;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < a_.steps; ++i) losses.push_back(step(local[i]));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    out.written = static_cast<double>(written_bytes() - w0) / a_.steps;
    out.group_bytes = static_cast<double>((group ? group->stats().bytes : 0) - g0) / a_.steps;
    out.step_ms = ms / a_.steps;
    out.cpu_ms = (process_cpu_ms() - c0) / a_.steps;
    out.backward_ms = backward / a_.steps;
    out.wait_ms = wait / a_.steps;
    out.losses = losses;
    const shardplan::DataParallel::GatherStats s1 = dp.gather_stats();
    out.gathers = static_cast<double>(s1.gathers - s0.gathers) / a_.steps;
    out.prefetched = static_cast<double>(s1.prefetched - s0.prefetched) / a_.steps;
    out.gather_wait_ms = (s1.wait_seconds - s0.wait_seconds) * 1e3 / a_.steps;
    out.peak_whole_mb = static_cast<double>(s1.peak_whole_bytes) / (1 << 20);
    series.state_bytes = zero ? zero->state_bytes() : shardplan::optimizer_state_bytes(*opt);
    if (sync) dp.check_replicas();  // throws naming the parameter if the sync is broken
    return out;
  }

 private:
  const Args& a_;
  shardplan::World& world_;
  shardplan::examples::ModelHandle m_;
  shardplan::Plan plan_;
  shardplan::ParallelReport report_;
  std::vector<at::Tensor> initial_;
  std::vector<Batch> batches_;
};

// The largest of every rank's values (the step is as slow as its slowest rank).
double slowest(shardplan::World& world, double v) {
  at::Tensor t = at::full({1}, v, at::kDouble);
  world.comm().all_reduce(t, shardplan::ReduceOp::Max);
  return t.item<double>();
}

// ZeRO-3's gathers: the gates' wait per step with prefetch (what compute did
// not hide) against without (each gather's whole time), median over rounds
// and paired per round. Reported for the rank that waited most (which also
// waits for slower ranks to reach each gather: their skew, which no prefetch
// hides) and the rank that waited least (the slowest to compute, whose wait
// is the gathers' own).
void report_zero3(shardplan::World& world, const Args& a, std::map<std::string, Series>& series) {
  for (const double sign : {1.0, -1.0}) {
    std::vector<double> on, off, hidden;
    for (int r = 0; r < a.rounds; ++r) {
      on.push_back(sign * slowest(world, sign * series["z3"].blocks[r].gather_wait_ms));
      off.push_back(sign * slowest(world, sign * series["z3np"].blocks[r].gather_wait_ms));
      hidden.push_back(off.back() > 0 ? 1 - on.back() / off.back() : 0.0);
    }
    if (world.rank() != 0) continue;
    const Block& b = series["z3"].blocks[0];
    if (sign > 0)
      std::printf("ZeRO-3, rank 0: the most parameter MiB whole or arriving at once: %.2f with prefetch, %.2f "
                  "without\n", b.peak_whole_mb, series["z3np"].blocks[0].peak_whole_mb);
    const double won = median(on), woff = median(off);
    std::printf("ZeRO-3, rank waiting %s: all-gathers per step %.0f (prefetched %.0f); gate wait per step, ms: "
                "prefetch on %.2f, off %.2f (the gathers' whole time)\n",
                sign > 0 ? "most" : "least", b.gathers, b.prefetched, won, woff);
    std::printf("ZeRO-3 gathers hidden 1 - wait(on)/wait(off), rank waiting %s: %.2f from the medians, %.2f paired "
                "per round (rounds %.2f..%.2f)\n",
                sign > 0 ? "most" : "least", woff > 0 ? 1 - won / woff : 0.0, median(hidden),
                *std::min_element(hidden.begin(), hidden.end()), *std::max_element(hidden.begin(), hidden.end()));
  }
}

int run(const Args& a, shardplan::World& world) {
  Bench bench(a, world);
  const bool lead = world.rank() == 0;
  std::map<std::string, Series> series;
  const size_t n = a.modes.size();
  for (int r = 0; r < a.rounds; ++r)
    for (size_t k = 0; k < n; ++k) {
      const std::string& mode = a.modes[(k + r) % n];
      Series& s = series[mode];
      s.blocks.push_back(bench.run(mode, s));
    }
  auto has = [&](const char* mode) { return series.count(mode) > 0; };
  // A median over rounds of one quantity of a mode's blocks.
  auto med = [&](const std::string& mode, double Block::*field) {
    std::vector<double> v;
    for (const auto& b : series[mode].blocks) v.push_back(b.*field);
    return median(v);
  };

  std::vector<std::string> bad;         // this rank's wrong results: always fail the run
  std::vector<std::string> off_target;  // bytes other than expected: fail with --check
  // Overlap changes when a bucket's reduction starts, never what it sums.
  if (has("on") && has("off"))
    for (int r = 0; r < a.rounds; ++r)
      if (series["on"].blocks[r].losses != series["off"].blocks[r].losses)
        bad.push_back("the losses with overlap on and off differ in round " + std::to_string(r));
  if (has("on") && has("zero"))
    for (int r = 0; r < a.rounds; ++r)
      for (int i = 0; i < a.steps; ++i) {
        const double x = series["on"].blocks[r].losses[i], z = series["zero"].blocks[r].losses[i];
        if (std::abs(x - z) > 1e-4 * std::abs(x))
          bad.push_back("ZeRO-1's loss " + std::to_string(z) + " differs from the all-reduce's " + std::to_string(x));
      }
  // Prefetching changes when a gather starts, never what it brings.
  if (has("z3") && has("z3np"))
    for (int r = 0; r < a.rounds; ++r)
      if (series["z3"].blocks[r].losses != series["z3np"].blocks[r].losses)
        bad.push_back("ZeRO-3's losses with prefetch on and off differ in round " + std::to_string(r));
  // The switch must switch: gathers ahead of use with it on, none with it off.
  if (has("z3") && series["z3"].blocks[0].prefetched == 0) bad.push_back("ZeRO-3 prefetched no all-gather");
  if (has("z3np") && series["z3np"].blocks[0].prefetched != 0)
    bad.push_back("ZeRO-3 prefetched with SHARDPLAN_ZERO3_PREFETCH=0");

  auto dp = bench.probe();
  const int d = dp.size();
  if (lead) {
    std::printf("bench_dp_step: GPT %s, global batch %lld, plan %s: mesh %s, %d ranks (%s backend)\n",
                bench.config().c_str(), static_cast<long long>(a.batch), a.plan.c_str(),
                bench.report().mesh.str().c_str(), world.size(), world.comm().backend().c_str());
    std::printf("malloc: %s\n", a.system_malloc ? "glibc defaults (--system-malloc 1)"
                                                : "freed memory kept in the heap (examples/models/heap.h)");
    std::printf("%s", dp.describe().c_str());
    std::printf("%d interleaved rounds of %d steps per mode (Adam); ms per step (wall; cpu: the process'\n"
                "threads together), median over rounds, slowest rank;\n"
                "bytes per step and rank (rank 0): handed to the batch axis' communicator, written to sockets\n",
                a.rounds, a.steps);
    std::printf("%-6s %9s %9s %9s %9s %14s %14s\n", "mode", "step", "backward", "wait", "cpu", "group B/step",
                "socket B/step");
  }
  std::map<std::string, double> step_ms, wait_ms, cpu_ms;
  std::map<std::string, std::vector<double>> per_round;
  for (const auto& mode : a.modes) {
    // Per round, the slowest rank's time (the ranks run the round together).
    for (const auto& b : series[mode].blocks) per_round[mode].push_back(slowest(world, b.step_ms));
    step_ms[mode] = median(per_round[mode]);
    const double b = slowest(world, med(mode, &Block::backward_ms)), w = slowest(world, med(mode, &Block::wait_ms));
    const double c = slowest(world, med(mode, &Block::cpu_ms));
    wait_ms[mode] = w;
    cpu_ms[mode] = c;
    if (lead)
      std::printf("%-6s %9.2f %9.2f %9.2f %9.2f %14.0f %14.0f\n", mode.c_str(), step_ms[mode], b, w, c,
                  med(mode, &Block::group_bytes), med(mode, &Block::written));
  }
  if (lead && has("on") && has("off") && has("none")) {
    const double on = step_ms["on"], off = step_ms["off"], none = step_ms["none"];
    // Differences per round first: both blocks of a round saw about the same
    // load, so they cancel what drifts over the run.
    std::vector<double> d_on, d_off;
    for (int r = 0; r < a.rounds; ++r) {
      d_on.push_back(per_round["on"][r] - per_round["none"][r]);
      d_off.push_back(per_round["off"][r] - per_round["none"][r]);
    }
    const double paired_on = median(d_on), paired_off = median(d_off);
    std::printf("sync cost per step, ms: off - none %.2f (paired %.2f), on - none %.2f (paired %.2f)\n", off - none,
                paired_off, on - none, paired_on);
    auto fraction = [](double exposed, double full) { return full > 0 ? 1 - exposed / full : 0.0; };
    std::printf("hidden fraction (off - on) / (off - none): %.2f from the medians, %.2f from the paired differences\n",
                fraction(on - none, off - none), fraction(paired_on, paired_off));
    std::printf("finish() wait, on vs off: %.2f of the wait removed; sync CPU per step (cpu - none's cpu): "
                "off %.2f ms, on %.2f ms\n",
                fraction(wait_ms["on"], wait_ms["off"]), cpu_ms["off"] - cpu_ms["none"], cpu_ms["on"] - cpu_ms["none"]);
  }
  if (has("z3") && has("z3np")) report_zero3(world, a, series);
  if (d > 1) {
    const double minimum = static_cast<double>(dp.min_wire_bytes());
    // "none" is the lower bound only if it syncs nothing but the loss.
    if (has("none") && med("none", &Block::group_bytes) != sizeof(double))
      off_target.push_back("none: handed " + std::to_string(med("none", &Block::group_bytes)) +
                           " bytes per step to the batch axis, expected 8 (the loss only)");
    for (const char* mode : {"on", "off", "zero"}) {
      if (!has(mode)) continue;
      // What DataParallel hands its group: the buckets to all-reduce, or with
      // ZeRO-1 the padded buckets to reduce-scatter plus this rank's slice of
      // each to all-gather; an int32 per parameter saying whether any rank
      // used it; and the loss.
      double expected = sizeof(double) + 4.0 * static_cast<double>(dp.averaged().size());
      for (const auto& b : dp.buckets()) {
        const double padded = static_cast<double>((b.numel + d - 1) / d * d * b.element_size);
        expected += std::string(mode) == "zero" ? padded + padded / d : static_cast<double>(b.bytes());
      }
      const double handed = med(mode, &Block::group_bytes);
      if (handed != expected)
        off_target.push_back(std::string(mode) + ": handed " + std::to_string(handed) +
                             " bytes per step to the batch axis, expected " + std::to_string(expected));
      if (!has("none")) continue;
      // gloo's framing adds a few hundred bytes per message; the payload on
      // the wire must be the minimum. Nothing on the sockets at all is the
      // gloo plugin's same-host shared-memory path (SHARDPLAN_GLOO_SHM=off
      // takes TCP), which has no wire to measure.
      const double wire = med(mode, &Block::written) - med("none", &Block::written);
      const double slack = 0.01 * minimum + 4096.0 * dp.buckets().size();
      if (wire >= minimum / 100 && (wire < minimum || wire > minimum + slack))
        off_target.push_back(std::string(mode) + ": " + std::to_string(wire) + " bytes per step written to sockets for " +
                      "the batch axis, not the minimum " + std::to_string(minimum) + " (plus framing)");
    }
    if (lead) {
      std::printf("batch axis per step and rank: gradients %lld bytes; handed to the communicator %.0f ('on');\n"
                  "  ring all-reduce on the wire %lld, theoretical minimum 2(D-1)/D x gradients %lld",
                  static_cast<long long>(dp.grad_bytes()), has("on") ? med("on", &Block::group_bytes) : 0.0,
                  static_cast<long long>(dp.wire_bytes()), static_cast<long long>(dp.min_wire_bytes()));
      for (const char* mode : {"on", "off", "zero"})
        if (has(mode) && has("none")) {
          const double wire = med(mode, &Block::written) - med("none", &Block::written);
          std::printf(";\n  measured on the sockets ('%s' - 'none') %.0f = %.4f x the minimum%s", mode, wire,
                      wire / minimum,
                      wire < minimum / 100 ? " (no sockets: gloo's same-host shared memory; SHARDPLAN_GLOO_SHM=off for TCP)"
                                           : "");
        }
      std::printf("\n");
    }
  }
  if (has("zero") && (has("on") || has("off"))) {
    const Series& full = has("on") ? series["on"] : series["off"];
    const double z = static_cast<double>(series["zero"].state_bytes), u = static_cast<double>(full.state_bytes);
    // Adam's two moments of at most D-1 padding elements per bucket.
    const double padding = 2.0 * (d - 1) * dp.buckets().size() * 8;
    if (z > u / d + padding || z < u / d)
      off_target.push_back("ZeRO-1 holds " + std::to_string(z) + " optimizer bytes, not 1/" + std::to_string(d) + " of " +
                    std::to_string(u));
    const double zmax = slowest(world, z), umax = slowest(world, u);
    if (lead)
      std::printf("optimizer state bytes per rank (largest): ZeRO-1 %.0f, unsharded %.0f: %.4f (1/D = %.4f)\n", zmax,
                  umax, zmax / umax, 1.0 / d);
  }
  std::fflush(stdout);
  for (const auto& b : bad) std::fprintf(stderr, "bench_dp_step: rank %d: %s\n", world.rank(), b.c_str());
  for (const auto& b : off_target)
    std::fprintf(stderr, "bench_dp_step: rank %d: %s%s\n", world.rank(), a.check ? "" : "warning: ", b.c_str());
  const bool failed = !bad.empty() || (a.check && !off_target.empty());
  return slowest(world, failed ? 1 : 0) > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (!a.system_malloc) shardplan::examples::keep_freed_heap();
  try {
    if (!shardplan::WorldOptions::env_has_job())
      usage(argv[0], "run it under the launcher: shardplan launch -n N --backend gloo -- bench_dp_step ...");
    auto world = shardplan::init_world(shardplan::WorldOptions::from_env());
    return run(a, *world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dp_step: error: %s\n", e.what());
    return 1;
  }
}
