#pragma once
// One training step of the example driver (train_loop.cpp) and its log
// line: the global batch's slice for this data rank in micro-batches,
// backward, --clip, the optimizer step, the global batch's mean loss.
#include <chrono>
#include <cmath>
#include <cstdint>

#include "models/train_rank.h"

namespace shardplan {

class DataParallel;

namespace examples {

struct StepResult {
  // The global batch's mean, the same on every rank (the pipeline's); NaN
  // where only this data rank's own is known (train_step's: averaging it
  // every step would cost an all-reduce, StepLog does at the steps it prints).
  double loss = 0;
  double local_loss = std::nan("");  // this data rank's mean loss (train_step)
  double lr = 0;    // the lr the optimizer stepped with (models/schedule.h)
  // With --clip: the total gradient norm before clipping (NaN without).
  double norm = std::nan("");
  // With --loss-scale: the scale the step's loss was multiplied by, and
  // whether an inf/NaN gradient on some rank made every rank skip it.
  double scale = std::nan("");
  bool skipped = false;
  // This rank's communication since the world's reset, up to the optimizer
  // step (the loss' average not counted: step 1's line is the model's).
  CommStats comm;
};

// Trains one step on `batch`, the global batch every rank drew alike, at
// the schedule's lr. Running out of memory names the step and its phase
// (models/out_of_memory.h).
StepResult train_step(const TrainRank& r, DataParallel& dp, Optimizer& opt, Schedule& schedule, Batch batch,
                      int step);

// --check-replicas: every replicated parameter compared across its ranks
// (DataParallel::check_replicas, every mesh axis); a drift stops the run
// with an error naming the step.
void check_replicas_at(int step, const DataParallel& dp);

// What rank 0 prints about the steps: once, step 1's communication against
// the model's stated minimum; then every --log-every steps (and the first
// and last), the loss, the mean since the last line and the throughput.
// A step's local_loss is averaged over `dp`'s batch axis only at those
// steps, with the local sum since the last line in the same call:
// after_step is collective over it, on every rank.
class StepLog {
 public:
  StepLog(const TrainRank& r, int start, const DataParallel* dp = nullptr);
  void after_step(int step, const StepResult& s);
  // The bytes per step the model states as the minimum for its own plan;
  // -1 for another plan or none stated.
  int64_t minimum() const { return minimum_; }

 private:
  void first_step_communication(const CommStats& first) const;

  const TrainRank& r_;
  const DataParallel* dp_;
  const int start_;
  const int64_t items_;
  const bool own_plan_;
  const int64_t minimum_;
  std::chrono::steady_clock::time_point since_;
  int since_step_;
  double loss_sum_ = 0;
  double local_sum_ = 0;  // local losses since the last line, not averaged yet
};

}  // namespace examples
}  // namespace shardplan
