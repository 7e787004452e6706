#pragma once
// Applying a plan to a model: every parameter a rule matches is handed, with
// the other parameters of its module, to the layer plugin registered for that
// module's type, which checks the layouts, slices this rank's shards and
// installs its parallel strategy.
#include <cstdint>
#include <string>
#include <vector>

#include "shardplan/mesh.h"
#include "shardplan/plan.h"
#include "shardplan/split.h"

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace shardplan {

class World;

struct ReportRow {
  std::string path;                   // "fc1.weight"
  // The name the plan's regexes (rules, data_parallel.ignore) are matched
  // against: `path`, or its Keras name under `paths: keras` ("fc1/kernel").
  std::string plan_path;
  std::string module_type;            // "shardplan::nn::LinearImpl"
  std::string rule;                   // "plans/mlp.yaml:12:5", or "" when unmatched
  // "[model, null]": the rule's, or for a parameter no rule places the axes
  // its plugin's splits cut it along (a bias following its weight: "[model]").
  std::string layout;
  std::string plugin;                 // "dense", or "" when replicated without a plugin
  std::string note;                   // what the plugin made of it
  std::vector<int64_t> global_shape;
  std::vector<int64_t> local_shape;
  int64_t element_size = 0;
  // The first parameter (named_parameters() order) that is the same tensor
  // as this one (a tied weight), or "". Tied rows hold no bytes of their own.
  std::string tied_to;
  // How this rank's shard was cut from the global tensor, one entry per
  // split dim (empty: whole). collect/relocate_state_dict and checkpoints
  // put pieces together with these.
  std::vector<ShardSplit> splits;
};

// A module the plan's `recompute:` names (shardplan/recompute.h).
struct RecomputeRow {
  std::string path;         // "blocks.0"
  std::string module_type;  // "shardplan::examples::GPTBlockImpl"
  std::string mode;         // "full" or "selective"
  std::string rule;         // where its pattern is written, "plans/gpt.yaml:9:5"
};

struct ParallelReport {
  Mesh mesh;
  int rank = 0;
  int world_size = 1;
  // named_parameters() order, then one row per parameterless module a rule
  // matched by path (shapes empty, layout describing its input).
  std::vector<ReportRow> rows;
  std::vector<std::string> warnings;
  std::string plan_yaml;              // the plan applied, canonical (Plan::to_yaml)
  std::vector<RecomputeRow> recompute;  // module order; empty without `recompute:`

  int64_t local_bytes() const;        // parameter bytes held by this rank (a tied tensor once)
  int64_t global_bytes() const;       // parameter bytes of the unsharded model (a tied tensor once)
  std::string table() const;          // human-readable, one row per parameter
  std::string json() const;           // the same as one JSON object (docs/PLAN_CHECK.md)
};

// `s` as a JSON string literal (quotes, backslashes and control characters
// escaped), for the reports' json() forms.
std::string json_str(const std::string& s);

// Shards `model` in place for this rank of `world`. Collective: every rank
// calls it with the same plan and an identically initialised model. A tensor
// registered in several modules (tied weights, shardplan/tied.h) is sharded
// once and stays one tensor; its paths must be planned alike. Makes an
// RngTracker over the plan's mesh current on the calling thread
// (shardplan/random.h). Throws
// PlanError / shardplan::Error naming the parameter, its rule and the module
// type (a vanilla torch::nn layer, a type no plugin handles, a size the axis
// does not divide).
ParallelReport parallelize(torch::nn::Module& model, const Plan& plan, World& world);

// The same checks and report without touching the model or communicating.
ParallelReport check_plan(torch::nn::Module& model, const Plan& plan, int world_size, int rank = 0);
// The same, but every problem found (a layout of the wrong rank, a rule
// matching nothing, a module its plugin rejects, a tie planned two ways) is
// appended to `errors` as one line, module by module, instead of throwing
// the first; only a plan whose mesh cannot fit `world_size` still throws.
// Rows of a rejected module keep their global shapes. The plan checker
// (shardplan/plan_check.h) is built on it.
ParallelReport check_plan(torch::nn::Module& model, const Plan& plan, int world_size, int rank,
                          std::vector<std::string>& errors);

}  // namespace shardplan
