// The layer_norm layer plugin: shardplan::nn::LayerNorm and
// shardplan::nn::RMSNorm under tensor parallelism.
//
//   weight, bias [null, ...]  replicated: the only layout. A LayerNorm's
//                             mean and variance (an RMSNorm's mean square)
//                             span every feature, so splitting its weight
//                             would need them across ranks; Megatron keeps
//                             it whole too.
//
// Outside the sequence-parallel region there is nothing to do: every rank
// normalises the same whole activations and gets the same gradients. Inside
// it (Megatron's sequence parallelism) each rank normalises its part of the
// sequence, so its weight (and bias) gradients are sums over that part only:
// the strategy passes both through sequence_parallel_param, which all-reduces
// their gradients over the sequence axis. Forgetting this is the classic
// silent bug of sequence parallelism: the replicas of the weight drift apart.
#include <ATen/ATen.h>

#include "shardplan/communicator.h"
#include "shardplan/layer_plugin.h"
#include "shardplan/mappings.h"
#include "shardplan/nn/layer_norm.h"
#include "shardplan/nn/rms_norm.h"
#include "shardplan/plugin_support.h"

namespace shardplan {
namespace {

const char* kLayerNormType = "shardplan::nn::LayerNormImpl";
const char* kRMSNormType = "shardplan::nn::RMSNormImpl";

// What both norms' strategies share: the group and how to say what they do.
class SequenceParallel {
 public:
  SequenceParallel(std::shared_ptr<Communicator> group, SequenceShard seq)
      : group_(std::move(group)), seq_(std::move(seq)) {}
  std::string say() const {
    return "replicated" + sequence_note(seq_) + " over '" + group_->name() + "' (" +
           std::to_string(group_->size()) + ")";
  }

 protected:
  std::shared_ptr<Communicator> group_;
  SequenceShard seq_;
};

class SequenceParallelNorm : public nn::LayerNormStrategy, SequenceParallel {
 public:
  using SequenceParallel::SequenceParallel;
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                     const torch::nn::LayerNormOptions& o) override {
    return at::layer_norm(x, o.normalized_shape(), sequence_parallel_param(w, *group_),
                          sequence_parallel_param(b, *group_), o.eps());
  }
  std::string describe() const override { return say(); }
};

class SequenceParallelRMSNorm : public nn::RMSNormStrategy, SequenceParallel {
 public:
  using SequenceParallel::SequenceParallel;
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const nn::RMSNormOptions& o) override {
    return nn::rms_norm(x, sequence_parallel_param(w, *group_), o.eps(), o.unit_offset());
  }
  std::string describe() const override { return say(); }
};

void decide(const ModuleShard& shard) {
  const std::string what = shard.type == kRMSNormType ? "an RMSNorm" : "a LayerNorm";
  for (const auto& p : shard.params) {
    const Rule* rule = rule_of(&p);
    for (const auto& d : p.assignment.layout)
      if (d)
        fail_param(p, what + " cannot be split (its statistics span every feature): layout " +
                          layout_str(p.assignment.layout) + " must be all null");
    for (const char* key : {"output", "input", "blocks", "overlap", "head_dim", "replicate_heads"})
      reject_option(rule, key, "does not apply to " + what);
  }
}

class LayerNormPlugin : public LayerPlugin {
 public:
  std::string name() const override { return "layer_norm"; }
  std::vector<std::string> module_types() const override { return {kLayerNormType, kRMSNormType}; }
  bool supports_sequence_parallel() const override { return true; }

  void check(ModuleShard& shard) const override {
    decide(shard);
    for (auto& p : shard.params)
      p.note = shard.sequence.on ? "replicated" + sequence_note(shard.sequence) +
                                       ", gradient all-reduced over '" + shard.sequence.axis + "'"
                                 : "replicated";
  }

  void apply(ModuleShard& shard) const override {
    decide(shard);
    if (!shard.sequence.on) return;
    auto group = shard.group(shard.sequence.axis);
    if (auto* rms = dynamic_cast<nn::RMSNormImpl*>(shard.module)) {
      rms->set_strategy(std::make_shared<SequenceParallelRMSNorm>(group, shard.sequence));
      return;
    }
    auto& norm = dynamic_cast<nn::LayerNormImpl&>(*shard.module);
    norm.set_strategy(std::make_shared<SequenceParallelNorm>(group, shard.sequence));
  }
};

}  // namespace
}  // namespace shardplan

SHARDPLAN_LAYER_PLUGIN(shardplan::LayerNormPlugin, "layer_norm")
