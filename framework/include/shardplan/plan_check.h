#pragma once
// The plan checker: what a plan will do to a model, before anything runs
// (`shardplan plan check`, docs/PLAN_CHECK.md). Per parameter the rule, the
// layout, global and local shapes and the plugin's note; every error the plan
// would stop on, all of them rather than the first; parameter bytes per rank;
// and, when filled in by the caller (shardplan/dry_run.h), the bytes one
// training step communicates.
#include <cstdint>
#include <string>
#include <vector>

#include "shardplan/communicator.h"
#include "shardplan/parallelize.h"

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace shardplan {

// A tensor known only by its name, shape and element size, as a checkpoint
// lists it.
struct TensorShape {
  std::string path;
  std::vector<int64_t> shape;
  int64_t element_size = 4;
};

struct PlanCheck {
  std::string plan_file;               // as the plan was loaded (Plan::source)
  std::string subject;                 // "model gpt (vocab=256 ...)", "state dict ckpt/"
  int world_size = 1;
  ParallelReport report;               // rank 0's rows
  std::vector<std::string> errors;     // one line each; empty: the plan can run
  std::vector<std::string> notes;      // what was and was not checked
  std::vector<int64_t> rank_bytes;     // parameter bytes each rank holds (empty after errors)
  // False when only names and shapes were known: the layer plugins (and so
  // their checks of heads, gates, blocks and options) were not consulted.
  bool plugins_consulted = true;
  // One training step (forward + backward), when measured: per rank, what
  // was handed to collectives, and the batch it was measured on.
  std::vector<CommStats> step_comm;
  std::string batch;

  bool ok() const { return errors.empty(); }
  uint64_t max_step_bytes() const;     // over ranks; 0 when not measured
  std::string table() const;
  std::string json() const;
};

// Checks `plan` against `model` at `world_size` without touching the model
// or communicating: ParallelReport and every error (check_plan collecting
// errors), and each rank's parameter bytes. A mesh that cannot fit the
// world size is an error like the others.
PlanCheck check_plan_for_model(torch::nn::Module& model, const Plan& plan, int world_size);

// The same from names and shapes alone (a checkpoint): rules, layout ranks,
// rules matching nothing and how each split dim divides among its axis'
// ranks. Module types are unknown, so no plugin is consulted; a rule that
// matches nothing is only a warning (it may be meant for a module without
// parameters, such as a loss, which a state dict does not list) and a split
// dim the axis does not divide is a warning (vocab-parallel embeddings allow
// that; most layers do not).
PlanCheck check_plan_for_shapes(const std::vector<TensorShape>& tensors, const Plan& plan, int world_size);

}  // namespace shardplan
