// The cross_entropy layer plugin: vocab-parallel loss for
// shardplan::nn::CrossEntropyLoss.
//
// A loss has no parameters, so its rule matches the MODULE's path and the
// layout describes the logits it receives:
//
//   - {match: 'loss', layout: [null, model]}
//
// says "the logits (N, C) arrive split over 'model' along the class dim"
// (from a column-parallel head with `output: sharded`). The plugin then
// installs shardplan::vocab_parallel_cross_entropy, which reduces maxima,
// exp-sums and target logits across the group instead of gathering the
// logits. A layout of all nulls keeps the plain torch loss. Class weights are
// supported: each rank reads the slice of its classes.
#include <ATen/ATen.h>

#include "shardplan/communicator.h"
#include "shardplan/layer_plugin.h"
#include "shardplan/nn/cross_entropy.h"
#include "shardplan/plugin_support.h"

namespace shardplan {
namespace {

const char* kLossType = "shardplan::nn::CrossEntropyLossImpl";

class VocabParallel : public nn::CrossEntropyStrategy {
 public:
  VocabParallel(std::shared_ptr<Communicator> group, std::string path, size_t dims, SourceLoc layout_loc)
      : group_(std::move(group)), path_(std::move(path)), dims_(dims), layout_loc_(std::move(layout_loc)) {}
  at::Tensor forward(const at::Tensor& input, const at::Tensor& target,
                     const torch::nn::CrossEntropyLossOptions& options) override {
    // A layout for (N, C) applied to (N, C, d1) would split the wrong dim's
    // meaning silently; the plan's rank is the contract.
    if (static_cast<size_t>(input.dim()) != dims_)
      throw PlanError(layout_loc_, "module '" + path_ + "': the plan's layout has " + std::to_string(dims_) +
                                       " dims but the logits have " + std::to_string(input.dim()) + " (shape " +
                                       c10::str(input.sizes()) + ")");
    return vocab_parallel_cross_entropy(input, target, *group_, options);
  }
  std::string describe() const override {
    return "vocab-parallel over '" + group_->name() + "' (" + std::to_string(group_->size()) + ")";
  }

 private:
  std::shared_ptr<Communicator> group_;
  std::string path_;
  size_t dims_;
  SourceLoc layout_loc_;  // where the plan wrote the layout, for the error
};

struct Decision {
  std::string axis;  // empty: replicated
  int64_t parts = 1;
};

[[noreturn]] void fail_layout(const ModuleShard& s, const std::string& message) {
  throw PlanError(s.rule->layout_loc, "module '" + s.path + "' (" + s.type + "): " + message);
}

Decision decide(const ModuleShard& s) {
  if (!s.rule)
    throw Error("module '" + s.path + "' of type " + s.type +
                " has no parameters to match; give it a rule over its module path whose layout describes its input");
  const Rule& rule = *s.rule;
  for (const char* key : {"output", "blocks", "overlap"})
    reject_option(&rule, key, "does not apply to a loss; its layout describes its input");
  if (const RuleOption* o = rule.option("input"); o && o->value != "sharded")
    throw PlanError(o->loc, "a loss's input is described by its layout; 'input: " + o->value + "' contradicts it");

  const Layout& l = s.layout;
  if (l.empty()) fail_layout(s, "the layout describes the logits and needs one entry per dim, e.g. [null, model]");
  const size_t class_dim = l.size() == 1 ? 0 : 1;
  Decision d;
  for (size_t i = 0; i < l.size(); ++i) {
    if (!l[i]) continue;
    if (i != class_dim)
      fail_layout(s, "the logits can be split only along the class dim (dim " + std::to_string(class_dim) +
                         ", as torch's cross_entropy reads them), got " + layout_str(l) +
                         "; a batch split is data parallelism, not a sharded loss");
    d.axis = *l[i];
  }
  if (d.axis.empty()) return d;
  d.parts = s.mesh->axis_size(d.axis);
  if (s.module) {
    // The class count is only known from the weights before the first
    // forward; without weights the producer (a column-parallel head) has
    // already checked divisibility.
    const auto* loss = dynamic_cast<const nn::CrossEntropyLossImpl*>(s.module);
    if (loss && loss->weight.defined() && loss->weight.size(0) % d.parts != 0)
      fail_layout(s, "its " + std::to_string(loss->weight.size(0)) +
                         " class weights are not divisible by mesh axis '" + d.axis + "' of size " +
                         std::to_string(d.parts));
  }
  return d;
}

class CrossEntropyPlugin : public LayerPlugin {
 public:
  std::string name() const override { return "cross_entropy"; }
  std::vector<std::string> module_types() const override { return {kLossType}; }

  void check(ModuleShard& shard) const override {
    Decision d = decide(shard);
    shard.note = d.axis.empty() ? "input replicated, plain cross-entropy"
                                : "input split over '" + d.axis + "' along the class dim, vocab-parallel";
  }

  void apply(ModuleShard& shard) const override {
    Decision d = decide(shard);
    // Over one rank the logits are whole: torch's cross-entropy is exact and
    // several times cheaper than the vocab-parallel algorithm.
    if (d.axis.empty() || d.parts == 1) return;
    auto& loss = dynamic_cast<nn::CrossEntropyLossImpl&>(*shard.module);
    loss.set_strategy(
        std::make_shared<VocabParallel>(shard.group(d.axis), shard.path, shard.layout.size(), shard.rule->layout_loc));
  }
};

}  // namespace
}  // namespace shardplan

SHARDPLAN_LAYER_PLUGIN(shardplan::CrossEntropyPlugin, "cross_entropy")
