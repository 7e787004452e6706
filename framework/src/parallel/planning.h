#pragma once
// What the phases of plan_model (planning*.cpp) share, and what parallelize
// and check_plan (parallelize.cpp) take from them. Not installed.
#include <torch/nn/module.h>

#include <cstddef>
#include <map>
#include <string>
#include <typeindex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shardplan/layer_plugin.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/recompute.h"
#include "plan/keras_paths.h"

namespace shardplan::parallel_detail {

// One use of a tied tensor: the module registering it and its name there.
struct TieUse {
  torch::nn::Module* module;
  std::string name;
  std::string path;
};

struct Planned {
  std::vector<ModuleShard> shards;        // modules a plugin handles
  std::vector<LayerPlugin*> plugins;      // parallel to shards
  std::vector<ReportRow> rows;
  std::vector<std::string> warnings;
  Mesh mesh;
  std::vector<std::vector<TieUse>> ties;  // tensors registered more than once, first use first
  std::string plan_yaml;
  // The modules `recompute:` names and their modes (set by parallelize), and their report rows.
  std::vector<std::pair<Recomputable*, RecomputeMode>> recompute;
  std::vector<RecomputeRow> recompute_rows;
};

// With `errors`, a problem found in a module or a tie is appended there and
// checking goes on with the next one (the plan checker lists them all);
// without, the first one throws. The shards' `mesh` points into the Planned
// that plan_model built: whoever keeps them must point it at its own copy.
Planned plan_model(torch::nn::Module& model, const Plan& plan, int world_size, int rank,
                   std::vector<std::string>* errors = nullptr);

// ---- Module types and their plugins (planning_plugins.cpp)

std::string type_of(const torch::nn::Module& m);
bool is_vanilla_torch(const std::string& type);
// "torch::nn::LinearImpl" -> "shardplan::nn::Linear"
std::string shardable_twin(const std::string& type);
// The plugin directories searched, for errors about a type none handles.
std::string searched_dirs();

// c10::demangle per module was a visible cost on models with thousands of
// modules of a handful of types.
class TypeNames {
 public:
  const std::string& of(const torch::nn::Module& m);

 private:
  std::unordered_map<std::type_index, std::string> names_;
};

struct PluginChoice {
  LayerPlugin* plugin;
  std::string name;
};
// Finding a plugin scans the plugin directories and loads what it finds, and
// models repeat a few module types thousands of times (a 10,000-parameter
// model spent 70% of plan_model here), so each (module type, requested
// plugin) is resolved once per plan application. Only successful lookups are
// kept: a failure throws at the first module that hits it, as before.
using PluginCache = std::map<std::pair<std::string, std::string>, PluginChoice>;

// Which plugin handles a type: the plan's `plugin:` option, else the first
// plugin on the search path that lists the type. nullptr when none does.
LayerPlugin* plugin_for(const std::string& type, const ModuleShard& shard, PluginCache& cache,
                        std::string* plugin_name);

// ---- Sequence parallelism of one module (planning_sequence.cpp)

// What sequence parallelism means for a module whose parameters (or, for a
// module without any, whose path) the given rules placed: the plan's
// setting, unless a rule says `sequence_parallel: false` or names another
// `sequence_dim`. Rules of one module must agree.
SequenceShard sequence_of(const Plan& plan, const std::string& axis, const std::vector<const Rule*>& rules,
                          const std::string& module);

// ---- The phases' common state

// Every parameter with its owning module, in named_parameters() order, and
// the modules without parameters of their own.
struct ModelScan {
  std::vector<ParamInfo> infos;
  std::vector<std::pair<torch::nn::Module*, std::string>> owners;  // (module, local name)
  std::vector<std::string> module_paths;                           // one per module visited
  std::vector<size_t> module_of;                                   // per parameter: index in module_paths
  std::vector<const void*> tensor_of;                              // per parameter: its TensorImpl (ties)
  // Modules without parameters of their own (losses, activations,
  // containers) can only be reached by a rule over their module path.
  std::vector<std::pair<torch::nn::Module*, std::string>> bare;    // (module, path)
  std::vector<detail::KerasName> keras_names;                      // paths: keras only, per parameter
};

struct Planning {
  Planning(const Plan& plan, int rank, std::vector<std::string>* errors)
      : plan(plan), rank(rank), errors(errors), keras(plan.paths == "keras") {}
  size_t rule_index(const Rule* r) const { return static_cast<size_t>(r - plan.rules.data()); }

  const Plan& plan;
  const int rank;
  std::vector<std::string>* const errors;
  // paths: keras: each parameter's Keras name and axis order (keras_paths.h).
  const bool keras;
  ModelScan scan;
  PlanMatch match;
  std::vector<bool> matched_params;  // by rule index: the rule placed a parameter
  std::vector<const Rule*> rule_of;  // per parameter, kept for the tie check
  // Report strings that depend only on the rule (or, unmatched, on the rank
  // of the tensor), made once rather than once per parameter.
  std::vector<std::string> rule_loc, rule_layout;
  std::map<size_t, std::string> unmatched_layout;
  TypeNames type_names;
  PluginCache plugins;
  std::string sequence_axis;
  // Modules with parameters, first-seen order, and per module the index in
  // out.rows of each of its parameters.
  std::vector<ModuleShard> candidates;
  std::vector<std::vector<size_t>> candidate_rows;
  Planned out;
};

// The phases after matching, in plan_model's order.
void check_modules(Planning& st);      // planning_modules.cpp
void check_ties(Planning& st);         // planning_ties.cpp
void plan_bare_modules(Planning& st);  // planning_bare.cpp
void plan_recompute(Planning& st, torch::nn::Module& model);  // planning_recompute.cpp

}  // namespace shardplan::parallel_detail
