// Pipeline parallelism on the example GPT (issue 36's figures,
// docs/BENCHMARKS.md "Pipeline parallelism"): per schedule, pipe size and
// micro-batch count, from Pipeline::stats() of every rank:
// - the bubble: each stage's idle share of its step, 1 - compute / step,
//   the median over steps, then the mean over stages (and the stages' range),
//   against the schedule's theory (p-1)/(m+p-1), over v interleaved;
// - the micro-batch chunks in flight at most and the activation bytes kept
//   for them, per stage (1F1B at most p - stage, GPipe m);
// - the bytes stage 0 sent per step against one micro-batch's activation
//   [T, B/m, E] x m (its activations forward; the gradients come back as
//   many bytes).
// As thread ranks (local backend), one world per pipe size:
//
//   bench_pipeline [--pipes 2,4] [--schedules gpipe,1f1b,interleaved] [--micro 4,8,16]
//                  [--batch 16] [--steps 7] [--config K=V,...] [--check 1] [--stages auto|time]
//
// (--stages time: the plans' `stages: {auto: time}`, balanced by the
// pieces' measured forward time instead of their parameters)
// or under the launcher, one process per rank, the world size the pipe size
// (or a plan's whole mesh with --plan, which then decides the schedule and
// micro-batches: e.g. plans/gpt_pipe_2d.yaml's TP inside each stage; a plan
// without a pipeline: key, e.g. plans/gpt_2d.yaml, times the model's forward,
// backward and gradient average instead):
//
//   shardplan launch -n 2 --backend gloo -- bench_pipeline --micro 4,8
//
// --check 1 fails the run unless the deterministic figures are exact: the
// bytes each stage sent, the chunks in flight (GPipe m, 1F1B p - stage,
// interleaved what simulate_schedule says) and, uninterleaved, the kept
// bytes (those chunks' inputs and outputs; not for a plan with rules).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "models/model.h"
#include "shardplan/count_option.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/pipeline.h"
#include "shardplan/pipeline_schedule.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace {

namespace ex = shardplan::examples;
using shardplan::PipelineStats;

struct Args {
  std::vector<int> pipes = {2, 4};
  std::vector<std::string> schedules = {"gpipe", "1f1b", "interleaved"};
  std::vector<int> micro = {4, 8, 16};
  int64_t batch = 16;
  int steps = 7;
  bool check = false;
  std::string config = "context=64,embed=128,heads=4,layers=8,mlp=512";
  std::string plan;  // a plan file instead of the generated ones
  std::string stages = "auto";  // the generated plans' stages: auto or {auto: time}
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream s(text);
  std::string item;
  while (std::getline(s, item, ',')) out.push_back(item);
  return out;
}

std::vector<int> counts(const char* argv0, const std::string& option, const std::string& text, int hi) {
  std::vector<int> out;
  for (const std::string& item : split(text))
    out.push_back(static_cast<int>(shardplan::count_or_exit(argv0, option, item, 1, hi)));
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw shardplan::Error(k + " needs a value");
      return argv[++i];
    };
    if (k == "--pipes") {
      a.pipes = counts(argv[0], k, next(), 64);
    } else if (k == "--micro") {
      a.micro = counts(argv[0], k, next(), 4096);
    } else if (k == "--schedules") {
      a.schedules = split(next());
    } else if (k == "--batch") {
      a.batch = shardplan::count_or_exit(argv[0], k, next(), 1, INT_MAX);
    } else if (k == "--steps") {
      a.steps = static_cast<int>(shardplan::count_or_exit(argv[0], k, next(), 1, 10000));
    } else if (k == "--check") {
      a.check = shardplan::count_or_exit(argv[0], k, next(), 0, 1) == 1;
    } else if (k == "--config") {
      a.config = next();
    } else if (k == "--stages") {
      a.stages = next();
      if (a.stages != "auto" && a.stages != "time") throw shardplan::Error("--stages must be auto or time");
    } else if (k == "--plan") {
      a.plan = next();
    } else {
      throw shardplan::Error("unknown argument '" + k +
                             "' (--pipes 2,4, --schedules gpipe,1f1b,interleaved, --micro 4,8,16, --batch N, "
                             "--steps N, --config K=V,..., --check 0|1, --stages auto|time, --plan FILE)");
    }
  }
  return a;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw shardplan::Error("cannot read " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string plan_text(int pipe, const std::string& schedule, int micro, const std::string& stages) {
  return "version: 1\nmesh: {pipe: " + std::to_string(pipe) + "}\npipeline: {schedule: " + schedule +
         ", micro_batches: " + std::to_string(micro) + (schedule == "interleaved" ? ", virtual_stages: 2" : "") +
         ", stages: " + (stages == "time" ? "{auto: time}" : "auto") + "}\nrules: []\n";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Per rank, what one configuration measured (the same on every rank once gathered).
struct Rank {
  int stage = 0;
  double bubble = 0, step_ms = 0;  // medians over steps
  PipelineStats last;              // the last step's counts
};

// Every rank's row, gathered by a sum over the world.
std::vector<Rank> gather(shardplan::World& world, const Rank& mine) {
  constexpr int64_t kCols = 8;
  at::Tensor t = at::zeros({world.size(), kCols}, at::kDouble);
  const PipelineStats& s = mine.last;
  const double row[kCols] = {static_cast<double>(mine.stage), mine.bubble, mine.step_ms,
                             static_cast<double>(s.bytes_sent), static_cast<double>(s.bytes_received),
                             static_cast<double>(s.peak_in_flight), static_cast<double>(s.peak_activation_bytes),
                             s.wait_s};
  for (int64_t c = 0; c < kCols; ++c) t[world.rank()][c] = row[c];
  world.comm().all_reduce(t);
  std::vector<Rank> all(world.size());
  for (int r = 0; r < world.size(); ++r) {
    const auto v = t[r];
    all[r].stage = static_cast<int>(v[0].item<double>());
    all[r].bubble = v[1].item<double>();
    all[r].step_ms = v[2].item<double>();
    all[r].last.bytes_sent = static_cast<int64_t>(v[3].item<double>());
    all[r].last.bytes_received = static_cast<int64_t>(v[4].item<double>());
    all[r].last.peak_in_flight = static_cast<int>(v[5].item<double>());
    all[r].last.peak_activation_bytes = static_cast<int64_t>(v[6].item<double>());
    all[r].last.wait_s = v[7].item<double>();
  }
  return all;
}

struct Model {
  ex::ModelHandle handle;
  ex::GPTConfig config;
};

// A plan without a pipeline: key (e.g. {data: 2, model: 2}, what the two
// hosts' comparison sets the pipeline against): the step is the model's
// forward and backward on this data rank's slice and the gradients'
// average over the batch axis, timed like a pipelined step.
Rank measure_data_parallel(const Args& a, const shardplan::Plan& plan, shardplan::World& world, const Model& ref,
                           const ex::Batch& batch) {
  auto module = ref.handle.module->clone();
  ex::ModelHandle m = ex::as_example(module);
  const auto report = shardplan::parallelize(*m.module, plan, world);
  shardplan::DataParallel dp(*m.module, report, plan, world);
  const ex::Batch local{dp.local_batch(batch.input), dp.local_batch(batch.target)};
  std::vector<double> steps;
  for (int i = 0; i <= a.steps; ++i) {
    m.module->zero_grad();
    world.comm().barrier();
    const auto t0 = std::chrono::steady_clock::now();
    m.model->loss(local).backward();
    dp.finish();
    if (i > 0) steps.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return {0, 0, median(steps), PipelineStats()};
}

// This rank's run of one plan: a fresh GPT (seeded alike on every rank),
// one warm-up step, then `steps` measured ones, each started together.
Rank measure(const Args& a, const shardplan::Plan& plan, shardplan::World& world, const Model& ref,
             const ex::Batch& batch) {
  auto module = ref.handle.module->clone();
  ex::ModelHandle m = ex::as_example(module);
  const auto report = shardplan::parallelize(*m.module, plan, world);
  auto* pieces = dynamic_cast<shardplan::PipelineModel*>(m.module.get());
  shardplan::Pipeline pipe(*m.module, *pieces, plan, world, &report, batch.input);
  ex::ExampleModel& model = *m.model;
  const shardplan::Pipeline::LossFn loss = [&model](const at::Tensor& out, const at::Tensor& target) {
    return model.output_loss(out, target);
  };
  std::vector<double> bubbles, steps;
  for (int i = 0; i <= a.steps; ++i) {
    m.module->zero_grad();
    world.comm().barrier();
    pipe.step(batch.input, batch.target, loss);
    const PipelineStats& s = pipe.stats();
    if (i == 0) continue;
    bubbles.push_back(1 - s.compute_s() / s.step_s);
    steps.push_back(s.step_s * 1e3);
  }
  return {pipe.stage(), median(bubbles), median(steps), pipe.stats()};
}

// The deterministic figures of rank r's stage; "" when exact.
// Kept bytes only without rules: a vocab-parallel head's logits are a shard.
std::string check_rank(const Rank& r, const shardplan::Plan& plan, int p, int64_t act, int64_t out) {
  const shardplan::PipelineSpec& spec = plan.pipeline;
  const int m = spec.micro_batches, v = spec.virtual_stages, stages = p * v, s = r.stage;
  int64_t boundaries = 0;
  for (int k = s; k < stages; k += p) boundaries += (k < stages - 1) + (k > 0);
  const auto sim = shardplan::simulate_schedule(shardplan::pipeline_schedule(spec.schedule, p, m, v));
  const int64_t kept = v == 1 && plan.rules.empty() ? r.last.peak_in_flight * ((s == 0 ? 0 : act) + (s == p - 1 ? out : act)) : -1;
  std::ostringstream bad;
  if (r.last.bytes_sent != boundaries * m * act || r.last.bytes_received != boundaries * m * act)
    bad << " sent " << r.last.bytes_sent << " received " << r.last.bytes_received << ", expected "
        << boundaries * m * act << " each;";
  if (r.last.peak_in_flight != sim.peak_in_flight[s]) bad << " in flight " << r.last.peak_in_flight << " not " << sim.peak_in_flight[s] << ";";
  if (spec.schedule == "gpipe" && r.last.peak_in_flight != m) bad << " gpipe in flight is not m;";
  if (spec.schedule == "1f1b" && r.last.peak_in_flight != p - s) bad << " 1f1b in flight is not p - stage;";
  if (kept >= 0 && r.last.peak_activation_bytes != kept) bad << " kept " << r.last.peak_activation_bytes << " not " << kept << ";";
  return bad.str();
}

// One figure per stage, "a/b/c" (of the stage's first rank).
template <class F>
std::string per_stage(const std::vector<Rank>& all, int p, F figure) {
  std::string out;
  for (int s = 0; s < p; ++s)
    for (const Rank& r : all)
      if (r.stage == s) {
        out += (s ? "/" : "") + figure(r);
        break;
      }
  return out;
}

std::string fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// One table row (rank 0 prints); false when --check finds a figure off.
bool report(const Args& a, const shardplan::Plan& plan, const std::vector<Rank>& all, int p, const Model& ref,
            int64_t local_batch) {
  const shardplan::PipelineSpec& spec = plan.pipeline;
  const int m = spec.micro_batches, v = spec.virtual_stages;
  const int64_t rows = local_batch / m, elem = 4;
  const int64_t act = ref.config.context * rows * ref.config.embed * elem;
  const int64_t out = ref.config.context * rows * ref.config.vocab * elem;
  double bubble = 0, lo = 1, hi = 0, step = 0;
  for (const Rank& r : all) {
    bubble += r.bubble / static_cast<double>(all.size());
    lo = std::min(lo, r.bubble), hi = std::max(hi, r.bubble), step = std::max(step, r.step_ms);
  }
  std::string bad;
  for (const Rank& r : all) {
    const std::string b = check_rank(r, plan, p, act, out);
    if (!b.empty()) bad += " stage " + std::to_string(r.stage) + ":" + b;
  }
  std::printf("%-11s %2d %2d %3d %9.1f %7.3f %5.3f-%.3f %7.3f %12s %22s %10.2f %8.3f %s\n", spec.schedule.c_str(), p, v,
              m, step, bubble, lo, hi, shardplan::pipeline_bubble(spec.schedule, p, m, v),
              per_stage(all, p, [](const Rank& r) { return std::to_string(r.last.peak_in_flight); }).c_str(),
              per_stage(all, p, [](const Rank& r) { return fixed(r.last.peak_activation_bytes / 1048576.0, 2); }).c_str(),
              all[0].last.bytes_sent / 1048576.0, static_cast<double>(all[0].last.bytes_sent) / static_cast<double>(act * m),
              bad.empty() ? "exact" : ("OFF:" + bad).c_str());
  return !a.check || bad.empty();
}

void header(const Args& a, const Model& ref, shardplan::World& world) {
  std::printf("bench_pipeline: GPT %s; batch %lld; %d ranks on %s; %d steps after one warm-up, medians\n",
              ref.config.str().c_str(), static_cast<long long>(a.batch), world.size(), world.comm().backend().c_str(),
              a.steps);
  std::printf("%-11s %2s %2s %3s %9s %7s %11s %7s %12s %22s %10s %8s %s\n", "schedule", "p", "v", "m", "step ms",
              "bubble", "stage range", "theory", "in flight", "kept MiB per stage", "sent MiB", "/(A x m)",
              "counts");
}

bool valid(const std::string& schedule, int p, int m, int64_t batch) {
  if (batch % m != 0 || (schedule == "1f1b" && m < p) || (schedule == "interleaved" && m % p != 0)) return false;
  return schedule == "gpipe" || schedule == "1f1b" || schedule == "interleaved";
}

// Every configuration for this world (its size the pipe size), or --plan's.
bool run(const Args& a, shardplan::World& world, const Model& ref) {
  torch::manual_seed(2);
  const ex::Batch batch{torch::randint(ref.config.vocab, {a.batch, ref.config.context}, torch::kLong),
                        torch::randint(ref.config.vocab, {a.batch, ref.config.context}, torch::kLong)};
  std::vector<shardplan::Plan> plans;
  if (!a.plan.empty()) {
    plans.push_back(shardplan::parse_plan(read(a.plan), a.plan));
  } else {
    for (const std::string& s : a.schedules)
      for (int m : a.micro)
        if (valid(s, world.size(), m, a.batch)) plans.push_back(shardplan::parse_plan(plan_text(world.size(), s, m, a.stages), "<bench>"));
  }
  if (world.rank() == 0) header(a, ref, world);
  bool ok = true;
  for (const shardplan::Plan& plan : plans) {
    const shardplan::Mesh mesh = plan.resolve_mesh(world.size());
    const int p = plan.pipeline.enabled ? mesh.axis_size(plan.pipeline.axis) : 1;
    const std::string data = plan.batch_axis();
    const int64_t local = a.batch / (!data.empty() && mesh.has_axis(data) ? mesh.axis_size(data) : 1);
    if (!plan.pipeline.enabled) {
      const std::vector<Rank> all = gather(world, measure_data_parallel(a, plan, world, ref, batch));
      double step = 0;
      for (const Rank& r : all) step = std::max(step, r.step_ms);
      if (world.rank() == 0) std::printf("%-11s %2s %2s %3s %9.1f (no pipeline: forward, backward, gradients averaged over '%s')\n", "data", "-", "-", "-", step, data.c_str());
      continue;
    }
    const std::vector<Rank> all = gather(world, measure(a, plan, world, ref, batch));
    if (world.rank() == 0) ok = report(a, plan, all, p, ref, local) && ok;
    std::fflush(stdout);
  }
  return ok;
}

Model make(const Args& a) {
  const ex::Overrides config = ex::parse_overrides(a.config);
  torch::manual_seed(1);
  return {ex::make_model("gpt", config), ex::GPTConfig::from(config)};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    const Model ref = make(a);
    bool ok = true;
    if (shardplan::WorldOptions::env_has_job()) {
      auto world = shardplan::init_world(shardplan::WorldOptions::from_env());
      at::Tensor bad = at::full({1}, run(a, *world, ref) ? 0.0 : 1.0);
      world->comm().all_reduce(bad);
      ok = bad.item<double>() == 0;
    } else {
      if (!a.plan.empty()) throw shardplan::Error("--plan runs under the launcher (shardplan launch -n N ...)");
      for (int p : a.pipes)
        shardplan::run_ranks_in_threads(p, [&](shardplan::World& w) {
          if (!run(a, w, ref)) ok = false;
        });
    }
    if (!ok) std::fprintf(stderr, "bench_pipeline: a deterministic figure is off (--check 1)\n");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pipeline: error: %s\n", e.what());
    return 1;
  }
}
