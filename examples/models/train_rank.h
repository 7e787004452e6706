#pragma once
// One rank's training in the example driver (train_loop.cpp), in the pieces
// it is made of: the model built and sharded by the plan (train_setup.cpp),
// the optimizer, and the checkpoints it resumes from and saves
// (train_checkpoints.cpp). The step itself and its log line are in
// train_step.h, what runs after the last step in train_after.h.
#include <ATen/core/Generator.h>

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "models/checkpoint_history.h"
#include "models/memory.h"
#include "models/model.h"
#include "models/schedule.h"
#include "models/train_args.h"
#include "shardplan/optimizer.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace shardplan {

class DataParallel;
class Pipeline;
struct CheckpointOptions;

namespace examples {

class Corpus;

// What every piece of one rank's training reads: the options, the world,
// and the model as the plan sharded it (`plan` and `report` empty when
// unsharded).
struct TrainRank {
  const Args& a;
  World& world;
  const Corpus* corpus = nullptr;
  int ranks_in_process = 1;
  at::ScalarType dtype = at::kFloat;
  ModelHandle m;
  Plan plan;
  ParallelReport report;
  bool lead() const { return world.rank() == 0; }
};

// Ranks that are threads share torch's global generator: models are built
// one at a time under this lock, from the same seed, so every rank starts
// from the same weights.
std::mutex& model_init_mutex();

// The model's config: config.json beside --load-weights (llama), then
// --config on top of it.
Overrides model_config(const Args& a);

// Builds the model (--load-weights: without memory for what the file
// replaces), shards it by --plan (auto: shardplan::auto_plan) and loads
// --load-weights into the shards, unless loads_into_slices(r). `r.m`,
// `r.plan`, `r.report` are set.
void build_sharded_model(TrainRank& r, const std::string& threads);

// ZeRO-3 (`data_parallel: {zero: 3}`) with --load-weights: the weights are
// loaded once DataParallel holds the slices, by load_into_slices (a no-op
// otherwise), so that no rank gives its whole shard memory.
bool loads_into_slices(const TrainRank& r);
void load_into_slices(const TrainRank& r, DataParallel& dp);

// Before step 1: the global batch divides over the data ranks and
// micro-batches; DataParallel's warnings and layout are printed.
void check_data_parallel(const TrainRank& r, const DataParallel& dp);

// Each rank's parameter bytes against what the plan promises.
void print_parameter_bytes(const TrainRank& r, int data_ranks);

// --optimizer over the model's unique parameters, or ZeRO-1's slices when
// the plan asks for it; with --dtype bfloat16/float16 over master weights
// in --master, with a loss scaler for --loss-scale dynamic.
std::unique_ptr<Optimizer> make_optimizer(const Args& a, DataParallel& dp);
// The torch optimizer --optimizer names, at --lr, over `params`.
std::unique_ptr<torch::optim::Optimizer> make_torch_optimizer(const Args& a, std::vector<at::Tensor> params);

// --save and --load / --resume auto for one rank's model, optimizer and lr
// schedule.
class TrainCheckpoints {
 public:
  TrainCheckpoints(TrainRank& r, Optimizer& opt, Schedule& schedule);
  // A pipelined run (train_pipeline.cpp): this rank's stage of `pipe`
  // (shardplan/pipeline_checkpoint.h), stepped by `opt`.
  TrainCheckpoints(TrainRank& r, const Pipeline& pipe, Optimizer& opt, Schedule& schedule);
  // Loads --load, or with --resume auto the newest of --save's checkpoints
  // that loads (resharded to this plan and world), and advances the data
  // stream `gen` past the steps it saw. Returns the first step to train.
  int resume(at::Generator& gen);
  // Saves at `step` when --save and --save-every ask for it.
  void maybe_save(int step);

 private:
  CheckpointOptions options() const;
  std::map<std::string, std::string> load(const std::string& dir);
  void save(const std::string& dir, const CheckpointOptions& o);

  TrainRank& r_;
  Optimizer& opt_;
  const Pipeline* pipe_ = nullptr;
  Schedule& schedule_;
  CheckpointHistory history_;
};

// Prints fn() on each rank in rank order (the barriers are collectives, so
// call it outside the measured steps).
template <class F>
void in_rank_order(World& world, F fn) {
  for (int r = 0; r < world.size(); ++r) {
    if (r == world.rank()) {
      fn();
      std::fflush(stdout);
    }
    world.comm().barrier();
  }
}

// SHARDPLAN_REPORT_MEMORY=1 (a benchmark switch, models/memory.h): runs fn and
// prints each process's resident memory before it, its peak during it and
// after it. Thread ranks share a process: one line for all of them.
template <class F>
void reporting_memory(World& world, int ranks_in_process, const char* what, F fn) {
  if (!memory_report_requested()) return fn();
  const ProcessMemory before = process_memory();
  bool reset = false;
  const ProcessMemory after = peak_during(world, ranks_in_process, fn, &reset);
  const std::string who = ranks_in_process > 1
                              ? "ranks 0-" + std::to_string(world.size() - 1) + " (threads of one process)"
                              : "rank " + std::to_string(world.rank());
  auto line = [&] {
    std::printf("%s: memory %s: RSS %s MiB before (peak since start %s), peak %s during%s, %s after\n", who.c_str(),
                what, mib(before.rss).c_str(), mib(before.peak).c_str(), mib(after.peak).c_str(),
                reset ? "" : " (since start: no reset)", mib(after.rss).c_str());
  };
  if (ranks_in_process > 1) {
    if (world.rank() == 0) line();
    std::fflush(stdout);
  } else {
    in_rank_order(world, line);
  }
}

}  // namespace examples
}  // namespace shardplan
