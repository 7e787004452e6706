#pragma once
// A plan: a mesh and ordered rules mapping parameter paths to layouts.
// The format is documented in docs/PLAN_FORMAT.md.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardplan/error.h"
#include "shardplan/mesh.h"

namespace shardplan {

// One entry per tensor dim: the mesh axis it is split over, or nullopt for
// replicated along that dim.
using Layout = std::vector<std::optional<std::string>>;
std::string layout_str(const Layout& layout);  // "[model, null]"

struct MeshAxisSpec {
  std::string name;
  int size = 0;  // kAutoSize: the world size divided by the other axes
  SourceLoc loc;
  static constexpr int kAutoSize = -1;
};

struct RuleOption {
  std::string value;  // scalars as written; sequences/maps as flow YAML
  SourceLoc loc;
};

class Matcher;  // compiled pattern (plan_regex.cpp)

struct Rule {
  size_t index = 0;        // position in the plan, 0-based
  std::string pattern;     // full-match regex over named_parameters() keys
  Layout layout;
  SourceLoc loc;           // the rule itself
  SourceLoc pattern_loc;   // its `match:` value
  SourceLoc layout_loc;    // its `layout:` value
  // Everything else on the rule (`output`, `input`, `blocks`, `plugin`, ...):
  // plugins read and validate these, and report errors at option.loc.
  std::map<std::string, RuleOption> options;
  std::shared_ptr<const Matcher> matcher;
  // Why the rule is there (auto_plan's reasons): to_yaml writes it as
  // `#` lines above the rule; parsing does not read comments back.
  std::string comment;

  bool matches(const std::string& path) const;
  const RuleOption* option(const std::string& key) const;
  // Option value, or `fallback` when absent; throws PlanError at the option's
  // location when the value is not one of `allowed` (if given).
  std::string option_or(const std::string& key, const std::string& fallback,
                        const std::vector<std::string>& allowed = {}) const;
};

struct ParamInfo {
  std::string path;             // named_parameters() key
  std::vector<int64_t> shape;   // global (unsharded) shape
};

struct Assignment {
  std::string path;
  std::vector<int64_t> shape;
  const Rule* rule = nullptr;   // nullptr: no rule matched, replicated
  Layout layout;                // all nullopt when unmatched
};

struct PlanMatch {
  Mesh mesh;
  std::vector<Assignment> params;     // same order as the input
  // Per module path given to assign(), same order: shape empty, rule nullptr
  // when no rule matched; layout is the rule's as written (it describes the
  // module's input, whose rank is only known to the plugin).
  std::vector<Assignment> modules;
  std::vector<std::string> warnings;  // e.g. rules that matched nothing with strict: false
};

// Data parallelism over the batch axis (docs/PLAN_FORMAT.md, "Data
// parallelism"): the top-level `batch_axis` and `data_parallel` keys.
struct DataParallelSpec {
  std::string batch_axis;      // as written; "" when absent (see Plan::batch_axis)
  SourceLoc batch_axis_loc;
  // Parameters whose gradients are not averaged: full-match regexes over
  // parameter paths (Rule::pattern and pattern_loc; no layout).
  std::vector<Rule> ignore;
  int64_t bucket_bytes = 25 * 1024 * 1024;  // `bucket_mb`, MiB as written
  std::string bucket_mb = "25";             // as written, for to_yaml
  // `first_bucket_mb`: the cap of the first bucket of each dtype and device
  // (DDP's 1 MiB), at most bucket_bytes: the last layers' gradients, which
  // backward produces first, start reducing while it goes on.
  int64_t first_bucket_bytes = 1024 * 1024;
  std::string first_bucket_mb = "1";
  bool overlap = true;         // start each bucket's reduction during backward
  // `zero`: the ZeRO stage over the batch axis, 0..3 (`true` is 1, `false` 0):
  // 1 shards the optimizer state, 2 also the gradients, 3 also the parameters.
  int zero = 0;
  SourceLoc zero_loc;
  // `reduce_dtype`: the dtype the batch axis' collectives run in (float32,
  // bfloat16, float16, float64); "": the gradient buckets' own.
  std::string reduce_dtype;
  SourceLoc reduce_dtype_loc;
  SourceLoc loc;               // the data_parallel map
};

// Sequence parallelism (docs/PLAN_FORMAT.md, "Sequence parallelism"): the
// top-level `sequence_parallel` map. Between tensor-parallel layers the
// activations are split along `dim` over `axis`.
struct SequenceParallelSpec {
  bool enabled = false;        // the key is present
  int64_t dim = 0;             // the sequence dim of activations; negative counts from the end
  std::string axis;            // as written; "" when absent (see Plan::sequence_axis)
  SourceLoc loc;               // the sequence_parallel map
  SourceLoc axis_loc;
};

// One entry of the top-level `divide` map (docs/PLAN_FORMAT.md, "Dividing
// attributes"): integer attributes of TorchScript modules that count what the
// model axis splits (attention heads), divided by its size when a plan is
// applied to a torch::jit::Module (shardplan/script.h).
struct DivideRule {
  std::string pattern;                 // full-match regex over module paths ("blocks.0.attn")
  std::vector<std::string> attributes; // "n_head"
  SourceLoc loc;                       // the pattern
  std::vector<SourceLoc> attribute_locs;
  std::shared_ptr<const Matcher> matcher;

  bool matches(const std::string& module_path) const;
};

// One entry of the top-level `recompute` list (docs/PLAN_FORMAT.md,
// "Activation recomputation"): modules whose forward is recomputed in
// backward instead of keeping its activations (shardplan/recompute.h).
struct RecomputeRule {
  std::string pattern;          // full-match regex over module paths ("blocks.0")
  std::string mode = "full";    // "full": the module's whole forward; "selective": attention's core
  SourceLoc loc;                // the pattern
  SourceLoc mode_loc;           // its `mode:` value, or the pattern's location
  std::shared_ptr<const Matcher> matcher;

  bool matches(const std::string& module_path) const;
};

// Pipeline parallelism (docs/PLAN_FORMAT.md, "Pipeline parallelism"): the
// top-level `pipeline` map. The mesh axis `axis` cuts the model's pieces
// (shardplan/pipeline.h) into stages; its coordinate is a rank's stage.
struct PipelineStagePattern {
  std::string pattern;  // full-match regex over module paths ("blocks\\.[0-3]")
  SourceLoc loc;
  std::shared_ptr<const Matcher> matcher;

  bool matches(const std::string& module_path) const;
};

struct PipelineSpec {
  bool enabled = false;               // the key is present
  std::string axis = "pipe";          // the mesh axis whose groups are the pipelines
  SourceLoc axis_loc;
  std::string schedule = "1f1b";      // gpipe | 1f1b | interleaved
  SourceLoc schedule_loc;
  int micro_batches = 1;              // per step, each a slice of the batch along dim 0
  SourceLoc micro_batches_loc;
  int virtual_stages = 1;             // model chunks per rank (interleaved only)
  SourceLoc virtual_stages_loc;
  // Per stage (axis size x virtual_stages of them), the patterns of the
  // module paths it runs; empty: `stages: auto` (balanced by parameters).
  std::vector<std::vector<PipelineStagePattern>> stages;
  // With stages empty, what auto balances: "params" (`stages: auto` or
  // `{auto: params}`) or "time" (`{auto: time}`: each piece's forward time,
  // measured on a sample batch when the Pipeline is made).
  std::string balance = "params";
  SourceLoc stages_loc;
  SourceLoc loc;                      // the pipeline map
};

class Plan {
 public:
  std::string source;                    // file path, or "<string>"
  int version = 1;
  std::vector<MeshAxisSpec> mesh;
  SourceLoc mesh_loc;
  std::vector<Rule> rules;
  std::vector<std::string> plugin_dirs;  // absolute; relative ones resolved against the plan's folder
  std::vector<SourceLoc> plugin_dir_locs;  // where each is written (searched only with SHARDPLAN_PLAN_PLUGINS=1)
  bool strict = true;                    // a rule that matches nothing is an error
  // `paths: keras`: rules match Keras-style names (dense/kernel) and their
  // layouts are in Keras's axis order; parallelize maps both onto the torch
  // parameters (docs/PLAN_FORMAT.md, "Keras paths"). "torch" otherwise.
  std::string paths = "torch";
  SourceLoc paths_loc;
  DataParallelSpec data_parallel;
  SequenceParallelSpec sequence_parallel;
  std::vector<DivideRule> divide;        // in the order written
  SourceLoc divide_loc;
  std::vector<RecomputeRule> recompute;  // in the order written; the first match of a module wins
  SourceLoc recompute_loc;
  PipelineSpec pipeline;
  // Written by to_yaml as `#` lines at the top (auto_plan: what it left
  // replicated and why); not parsed back.
  std::string comment;

  // The mesh axis that splits the batch: `batch_axis` when given, else an
  // axis called `data`, else one called `batch`, else "" (no data
  // parallelism).
  std::string batch_axis() const;
  // The mesh axis sequence parallelism splits activations over:
  // `sequence_parallel.axis` when given, else the one mesh axis that is
  // neither the batch axis nor the pipeline's; "" when sequence parallelism is off. Throws PlanError at
  // the map when the choice is ambiguous (checked at parse time).
  std::string sequence_axis() const;

  // First rule whose pattern fully matches `path`, or nullptr.
  const Rule* match(const std::string& path) const;
  // The mesh for this world size: resolves `auto`, and throws PlanError at the
  // mesh's location when the product differs from world_size.
  Mesh resolve_mesh(int world_size) const;
  // Matches every parameter, checks layout rank == tensor rank and rules that
  // matched nothing (error when strict, else a warning). Errors name the
  // parameter and the rule's file:line:col. Divisibility is left to plugins.
  // `module_paths` are paths of modules without parameters of their own
  // (losses): a rule may match one of those instead of a parameter, and
  // counts as having matched something. With `errors`, those errors are
  // appended there instead of thrown (a parameter whose layout has the wrong
  // rank is then left unmatched), so a checker can list them all.
  PlanMatch assign(const std::vector<ParamInfo>& params, int world_size,
                   const std::vector<std::string>& module_paths = {},
                   std::vector<std::string>* errors = nullptr) const;
  // Canonical YAML; parse_plan(to_yaml()) gives an equal plan.
  std::string to_yaml() const;
};

// Throws PlanError("file:line:col: ...") for YAML syntax errors, unknown keys,
// unknown axes, invalid regexes, malformed layouts and options, text that is
// not UTF-8, and plans past the limits below (they bound the memory and stack
// a plan can make a tool use; real plans are far below them).
constexpr size_t kMaxPlanBytes = 1 << 20;
constexpr size_t kMaxPlanRules = 10000;
Plan load_plan(const std::string& path);
Plan parse_plan(const std::string& yaml_text, const std::string& source_name = "<string>",
                const std::string& base_dir = ".");

// A plugin name: letters, digits, '_', '-', '.', not starting with '.'. No
// '/', so a name from a plan or --backend can only pick a file in a plugin
// directory. A plan names plugins, the loader finds them.
inline bool is_plugin_name(const std::string& name) {
  if (name.empty() || name[0] == '.') return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
          c == '.'))
      return false;
  return true;
}

}  // namespace shardplan
