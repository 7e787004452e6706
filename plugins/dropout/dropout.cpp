// The dropout layer plugin: which random stream a shardplan::nn::Dropout
// draws its masks from. A dropout has no parameters, so a rule reaches it by
// its module path, and the layout describes its input:
//
//   [null, ...]          whole activations, identical on every rank: the
//                        replicated stream, the same mask everywhere (the
//                        default, also without a rule)
//   [.., axis, ..]       activations split over `axis` (features after a
//                        column-parallel Linear left sharded): the stream
//                        forked over that axis, one mask per shard
//   in the sequence-parallel region: activations split along the sequence
//                        over its axis, so forked over it (Megatron draws
//                        the dropout after a reduce-scatter in the model-
//                        parallel RNG state for the same reason)
//
// Same masks across a shard's replicas on other mesh axes (data parallel
// copies), different ones across shards: random.h's RngTracker.
#include "shardplan/layer_plugin.h"
#include "shardplan/nn/dropout.h"
#include "shardplan/plugin_support.h"

namespace shardplan {
namespace {

const char* kDropoutType = "shardplan::nn::DropoutImpl";

// The axis the input is split over, or "" when it is whole.
std::string decide(const ModuleShard& s) {
  if (!s.rule) throw Error("module '" + s.path + "' of type " + s.type + " needs a rule over its module path");
  for (const char* key : {"output", "input", "blocks", "overlap"})
    reject_option(s.rule, key, "does not apply to a Dropout; its layout describes its input");
  std::string axis;
  for (const auto& d : s.layout) {
    if (!d) continue;
    if (!axis.empty() && *d != axis)
      throw PlanError(s.rule->layout_loc, "module '" + s.path + "': a Dropout's input split over two axes (" + axis +
                                              ", " + *d + ") has no single stream to draw from");
    axis = *d;
  }
  if (s.sequence.on) {
    if (!axis.empty() && axis != s.sequence.axis)
      throw PlanError(s.rule->layout_loc, "module '" + s.path + "' is in the sequence-parallel region over '" +
                                              s.sequence.axis + "' but its layout splits its input over '" + axis +
                                              "'");
    axis = s.sequence.axis;
  }
  return axis;
}

class DropoutPlugin : public LayerPlugin {
 public:
  std::string name() const override { return "dropout"; }
  std::vector<std::string> module_types() const override { return {kDropoutType}; }
  bool supports_sequence_parallel() const override { return true; }

  void check(ModuleShard& shard) const override {
    const std::string axis = decide(shard);
    shard.note = axis.empty() ? "input whole: one mask on every rank"
                              : "input split over '" + axis + "'" + (shard.sequence.on ? " along the sequence" : "") +
                                    ": masks drawn per shard";
  }

  void apply(ModuleShard& shard) const override {
    dynamic_cast<nn::DropoutImpl&>(*shard.module).sharded_axis = decide(shard);
  }
};

}  // namespace
}  // namespace shardplan

SHARDPLAN_LAYER_PLUGIN(shardplan::DropoutPlugin, "dropout")
