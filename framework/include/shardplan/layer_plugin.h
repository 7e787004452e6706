#pragma once
// Layer plugin ABI (C++). A layer plugin exports the C entry point of
// abi/plugin.h with kind SP_PLUGIN_LAYER and abi_version
// SHARDPLAN_LAYER_ABI_VERSION; its factory returns a LayerPlugin* that lives
// for the process. Layer plugins link libshardplan and libtorch, so they must
// be built against the same shardplan (the version below is bumped whenever
// these classes, or the shardplan::nn modules plugins read, change layout:
// 6 when nn::Linear came to declare its heads).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardplan/abi/plugin.h"
#include "shardplan/plan.h"
#include "shardplan/split.h"

#define SHARDPLAN_LAYER_ABI_VERSION 6u

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace shardplan {

class Communicator;

// What the plan says about one parameter of a module.
struct ParamShard {
  std::string name;                    // local name in the module: "weight"
  Assignment assignment;               // path, global shape, rule (or none), layout
  std::vector<int64_t> local_shape;    // filled by the plugin
  std::string note;                    // e.g. "column-parallel, bias follows weight"
  // How the plugin cuts it: {dim, axis, blocks, shared} per split dim (parts
  // and index are filled in by parallelize). Left empty, the layout's axes are
  // taken with blocks 1; a plugin that splits a parameter no rule placed
  // (a bias following its weight) or splits blocks must fill it. parallelize
  // checks it against local_shape, and checkpoints rely on it.
  std::vector<ShardSplit> splits;
};

// Sequence parallelism for one module (the plan's `sequence_parallel` map,
// refined by its rules' `sequence_parallel` and `sequence_dim` options):
// when `on`, the activations the module reads and writes between
// tensor-parallel layers are split along `dim` (negative: from the end) over
// mesh axis `axis`, and the plugin must keep them so: gather the sequence on
// entry where it needs it whole, reduce-scatter partial sums back onto it,
// and all-reduce over `axis` the gradients of replicated parameters that see
// only this rank's part of the sequence.
struct SequenceShard {
  bool on = false;
  std::string axis;
  int64_t dim = 0;
};

// One module the plan touches, handed to its plugin: either through its
// parameters (params filled, rule == nullptr) or, for a module with no
// parameters of its own such as a loss, through a rule matching the module's
// path (params empty, rule and layout set: the layout then describes the
// module's INPUT, since there is no parameter for it to describe).
struct ModuleShard {
  std::string path;                    // "blocks.0.mlp.fc1" ("" for the root)
  std::string type;                    // demangled type: "shardplan::nn::LinearImpl"
  torch::nn::Module* module = nullptr; // nullptr when only checking
  std::vector<ParamShard> params;      // every direct parameter of the module
  const Rule* rule = nullptr;          // module-path match only
  Layout layout;                       // module-path match only: layout of the input
  std::string note;                    // module-path match only, filled by the plugin
  SequenceShard sequence;
  // Filled by check(): what the user should know but is not an error (an
  // option that cannot pay off here); parallelize adds them to the report.
  std::vector<std::string> warnings;
  const Mesh* mesh = nullptr;
  int rank = 0;                        // this rank in the world (checking: any)
  // Process group along a mesh axis (nullptr when only checking).
  std::shared_ptr<Communicator> group(const std::string& axis) const;
  std::map<std::string, std::shared_ptr<Communicator>> groups;

  ParamShard* param(const std::string& name);
  const ParamShard* param(const std::string& name) const;
};

class LayerPlugin {
 public:
  virtual ~LayerPlugin() = default;
  virtual std::string name() const = 0;
  // Demangled type names this plugin shards, e.g. "shardplan::nn::LinearImpl".
  virtual std::vector<std::string> module_types() const = 0;
  // Validate layouts and options and fill local_shape/note of every param.
  // No communication, no module access: also used by the plan checker.
  // Throws PlanError at the rule's location, or shardplan::Error naming the
  // parameter.
  virtual void check(ModuleShard& shard) const = 0;
  // Replace each parameter with this rank's shard and install the strategy.
  // Called after check() on the same object.
  virtual void apply(ModuleShard& shard) const = 0;
  // Whether check()/apply() honour ModuleShard::sequence. parallelize refuses
  // to hand a sequence-parallel module to a plugin that does not, since it
  // would compute on a sequence shard as if it were whole.
  virtual bool supports_sequence_parallel() const { return false; }
};

}  // namespace shardplan

// Defines the entry point of a layer plugin: SHARDPLAN_LAYER_PLUGIN(DensePlugin, "dense")
#define SHARDPLAN_LAYER_PLUGIN(Class, plugin_name)                                  \
  extern "C" SP_PLUGIN_EXPORT const sp_plugin_info* shardplan_plugin_entry(void) {  \
    static const sp_plugin_info info = {                                            \
        SP_PLUGIN_ENTRY_VERSION, SP_PLUGIN_LAYER, SHARDPLAN_LAYER_ABI_VERSION,      \
        plugin_name, SHARDPLAN_PLUGIN_VERSION_STRING,                               \
        []() -> const void* { static Class instance; return &instance; }};          \
    return &info;                                                                   \
  }
#ifndef SHARDPLAN_PLUGIN_VERSION_STRING
#define SHARDPLAN_PLUGIN_VERSION_STRING "0.1.0"
#endif
