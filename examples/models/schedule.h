#pragma once
// The learning rate of the example trainers (train_loop.cpp): --warmup N
// steps of linear warmup, then a cosine decay from --lr to --lr-min over the
// steps left to --steps; without either, --lr throughout. The values are
// Megatron-core's OptimizerParamScheduler (cosine style, init_lr 0) at
// num_steps = the step's own number, so step k of the warmup trains at
// lr * k / N (the first at lr / N, never at 0 as Megatron's first step
// does: it steps its scheduler after the optimizer), the peak at step N, and
// the last step at --lr-min. One schedule step per optimizer step (all the
// micro-batches of a step share its lr). The position and the settings go
// in the checkpoint's attributes; a resume continues the same sequence, and
// refuses other settings unless --override-schedule (Megatron's
// --override-opt_param-scheduler) says to go on with them from the saved
// position. Torch-free header.
#include <cmath>
#include <cstdint>
#include <map>
#include <string>

namespace torch {
namespace optim {
class Optimizer;
}
}  // namespace torch

namespace shardplan {
namespace examples {

struct Args;

struct ScheduleSettings {
  double lr = 0;           // the peak (--lr)
  int warmup = 0;          // --warmup: steps 1..warmup rise linearly to lr
  double lr_min = NAN;     // --lr-min: the end of the cosine decay; nan: no decay
  int decay_end = 0;       // the step the decay reaches lr_min (--steps); 0 without a decay
  bool constant() const { return warmup == 0 && std::isnan(lr_min); }
  bool operator==(const ScheduleSettings& o) const;
  // "--warmup 4 --lr 0.002 --lr-min 0.0001 --steps 12", as a command line
  // would give it (values round-trip exactly).
  std::string str() const;
};

// What the command line asks for.
ScheduleSettings schedule_settings(const Args& a);

// "" when the schedule options fit together, else the one line usage()
// prints: --warmup at least --steps, --lr-min negative or above --lr,
// --override-schedule without a checkpoint to resume.
std::string check_schedule_options(const Args& a);

class Schedule {
 public:
  explicit Schedule(ScheduleSettings settings) : s_(settings) {}

  // The lr of step k (1-based count of optimizer steps).
  double lr_at(int64_t k) const;
  // The lr of the next optimizer step.
  double next_lr() const { return lr_at(position_ + 1); }
  // Sets next_lr() on every param group of the optimizer that steps (a plain
  // torch one, or ZeRO-1's inner one: shardplan::Optimizer::inner());
  // returns it.
  double apply(torch::optim::Optimizer& opt) const;
  // After each optimizer step that updated the parameters.
  void advance() { ++position_; }
  int64_t position() const { return position_; }
  const ScheduleSettings& settings() const { return s_; }

  // The checkpoint attributes "schedule" (settings) and
  // "schedule_position", added when the lr is not constant: a run without
  // a schedule writes what it always did.
  void save(std::map<std::string, std::string>& attributes) const;
  // Continues from a checkpoint's attributes. Same settings: its position.
  // Other ones (a checkpoint without a schedule counts as a constant lr at
  // its "step"): throws shardplan::Error naming both, unless
  // `override_settings`, which keeps these settings from its position. A
  // constant lr resumed from a constant checkpoint may change --lr, as it
  // always could. `from` names the checkpoint in messages.
  void resume(const std::map<std::string, std::string>& attributes, bool override_settings,
              const std::string& from);

 private:
  ScheduleSettings s_;
  int64_t position_ = 0;  // optimizer steps taken
};

}  // namespace examples
}  // namespace shardplan
