// The `lora` layer plugin: tensor parallelism for lora::LoRALinear, built
// outside shardplan's tree against its installed package (docs/WRITING_PLUGINS.md).
//
// The plan places the base weight, as for a Linear (`dense`); the adapter
// follows it, as PEFT and vLLM shard adapters:
//   weight [axis, null]  column-parallel: W, b and lora_B split by output
//                        rows, lora_A replicated. The input's gradient is
//                        all-reduced once for base and adapter together
//                        (both read the same copied input); lora_A's
//                        gradient, a partial sum per rank (each rank sees its
//                        rows of lora_B only), is all-reduced over the axis.
//   weight [null, axis]  row-parallel: W and lora_A split by input columns,
//                        lora_B and b replicated. Each rank's base partial and
//                        adapter partial are summed before the one
//                        all-reduce; lora_B's gradient, computed from this
//                        rank's partial x A^T, is all-reduced over the axis.
//   weight [null, null]  replicated.
// Options: `output` (column), `input` (row), `plugin`, and the sequence-
// parallel keys, meaning what they mean for `dense`. Sequence parallelism
// swaps the entry and exit collectives as Megatron does (gather the sequence
// in, reduce-scatter it out) and all-reduces the gradients of tensors that
// saw only this rank's part of the sequence.
#include <ATen/ATen.h>
#include <torch/nn/functional/linear.h>

#include "lora_linear.h"
#include "shardplan/communicator.h"
#include "shardplan/layer_plugin.h"
#include "shardplan/mappings.h"
#include "shardplan/plugin_support.h"
#include "shardplan/shard.h"

namespace lora {
namespace {

using namespace shardplan;
namespace F = torch::nn::functional;

// y += scale * (x A^T) B^T, or nothing once merged.
at::Tensor add_adapter(const at::Tensor& y, const at::Tensor& x, const at::Tensor& a, const at::Tensor& b,
                       double scale) {
  return a.defined() ? y + scale * F::linear(F::linear(x, a), b) : y;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string group_text(const Communicator& g) { return "'" + g.name() + "' (" + std::to_string(g.size()) + ")"; }

class ColumnLoRA : public LoRAStrategy {
 public:
  ColumnLoRA(std::shared_ptr<Communicator> group, bool gather, SequenceShard seq)
      : group_(std::move(group)), gather_(gather), seq_(std::move(seq)) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& a,
                     const at::Tensor& b, double scale) override {
    const at::Tensor in = seq_.on ? gather_sequence(x, *group_, seq_.dim) : copy_to_group(x, *group_);
    const at::Tensor a_all = a.defined() ? copy_to_group(a, *group_) : a;
    at::Tensor y = add_adapter(F::linear(in, w, bias), in, a_all, b, scale);
    return gather_ ? gather_from_group(y, *group_, -1) : y;
  }
  std::string describe() const override {
    return "LoRA column-parallel over " + group_text(*group_) + ", output " + (gather_ ? "gathered" : "sharded") +
           sequence_note(seq_);
  }

 private:
  std::shared_ptr<Communicator> group_;
  bool gather_;
  SequenceShard seq_;
};

class RowLoRA : public LoRAStrategy {
 public:
  RowLoRA(std::shared_ptr<Communicator> group, bool input_sharded, SequenceShard seq)
      : group_(std::move(group)), input_sharded_(input_sharded), seq_(std::move(seq)) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& a,
                     const at::Tensor& b, double scale) override {
    const at::Tensor xs = input_sharded_ ? x : scatter_to_group(x, *group_, -1);
    const at::Tensor b_all = b.defined() ? copy_to_group(b, *group_) : b;
    const at::Tensor partial = add_adapter(F::linear(xs, w), xs, a, b_all, scale);
    if (!seq_.on) {
      at::Tensor y = reduce_from_group(partial, *group_);
      return bias.defined() ? y + bias : y;
    }
    at::Tensor y = reduce_scatter_sequence(partial, *group_, seq_.dim);
    return bias.defined() ? y + sequence_parallel_param(bias, *group_) : y;
  }
  std::string describe() const override {
    return "LoRA row-parallel over " + group_text(*group_) + ", input " +
           (input_sharded_ ? "sharded" : "split on entry") + sequence_note(seq_);
  }

 private:
  std::shared_ptr<Communicator> group_;
  bool input_sharded_;
  SequenceShard seq_;
};

// Replicated tensors on this rank's part of the sequence: every gradient is
// a partial sum over the sequence parts.
class ReplicatedSequenceLoRA : public LoRAStrategy {
 public:
  ReplicatedSequenceLoRA(std::shared_ptr<Communicator> group, SequenceShard seq)
      : group_(std::move(group)), seq_(std::move(seq)) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& a,
                     const at::Tensor& b, double scale) override {
    auto sp = [&](const at::Tensor& t) { return t.defined() ? sequence_parallel_param(t, *group_) : t; };
    return add_adapter(F::linear(x, sp(w), sp(bias)), x, sp(a), sp(b), scale);
  }
  std::string describe() const override { return "LoRA replicated" + sequence_note(seq_); }

 private:
  std::shared_ptr<Communicator> group_;
  SequenceShard seq_;
};

enum class Mode { Replicated, Column, Row };

struct Decision {
  Mode mode = Mode::Replicated;
  std::string axis;
  int64_t parts = 1;
  bool gather = true;
  bool input_sharded = false;
};

// lora_A [r, in] and lora_B [out, r] must fit the base weight [out, in].
void check_shapes(const ParamShard& w, const ParamShard& a, const ParamShard& b) {
  const auto& ws = w.assignment.shape;
  const auto& as = a.assignment.shape;
  const auto& bs = b.assignment.shape;
  if (ws.size() != 2 || as.size() != 2 || bs.size() != 2)
    fail_param(w, "a LoRALinear's weight, lora_A and lora_B are matrices");
  if (as[1] != ws[1])
    fail_param(a, "lora_A is [r, in_features] = " + shape_text(as) + " but the base weight " + shape_text(ws) +
                      " has in_features " + std::to_string(ws[1]));
  if (bs[0] != ws[0])
    fail_param(b, "lora_B is [out_features, r] = " + shape_text(bs) + " but the base weight " + shape_text(ws) +
                      " has out_features " + std::to_string(ws[0]));
  if (bs[1] != as[0])
    fail_param(b, "rank r " + std::to_string(bs[1]) + " (dim 1 of " + shape_text(bs) +
                      ") does not match lora_A's rank r " + std::to_string(as[0]) + " (dim 0 of " + shape_text(as) +
                      ")");
}

// An adapter a rule placed must be placed as the base implies (the layout
// it gets anyway), so a plan never reads as doing something it does not.
void check_follows(const ParamShard* p, const Layout& expected) {
  if (p && rule_of(p) && p->assignment.layout != expected)
    fail_param(*p, "an adapter follows its base weight: layout " + layout_str(expected) + " or no rule, got " +
                       layout_str(p->assignment.layout));
}

void reject_dense_only(const Rule* rule) {
  for (const char* key : {"blocks", "overlap", "head_dim", "replicate_heads"})
    reject_option(rule, key, "is not supported by the lora plugin");
}

const Layout kWhole{std::nullopt, std::nullopt};

// Column-parallel: out_features split; lora_B and the bias follow.
void decide_column(const ModuleShard& shard, const Rule* rule, Decision& d) {
  const ParamShard* bias = shard.param("bias");
  d.mode = Mode::Column;
  reject_option(rule, "input", "applies to a row-parallel LoRALinear (weight [null, axis])");
  d.gather = output_option_gathered(rule);
  if (shard.sequence.on && d.gather)
    fail_param(*shard.param("weight"),
               "a column-parallel LoRALinear in the sequence-parallel region needs output: sharded");
  check_follows(shard.param("lora_A"), kWhole);
  check_follows(shard.param("lora_B"), Layout{d.axis, std::nullopt});
  if (bias && rule_of(bias) && bias->assignment.layout != Layout{d.axis})
    fail_param(*bias, "the bias of a column-parallel LoRALinear follows its weight: layout [" + d.axis + "]");
}

// Row-parallel: in_features split; lora_A follows, the bias stays whole.
void decide_row(const ModuleShard& shard, const Rule* rule, Decision& d) {
  const ParamShard* bias = shard.param("bias");
  d.mode = Mode::Row;
  reject_option(rule, "output", "applies to a column-parallel LoRALinear (weight [axis, null])");
  d.input_sharded = input_option_sharded(rule);
  if (shard.sequence.on && !d.input_sharded)
    fail_param(*shard.param("weight"),
               "a row-parallel LoRALinear in the sequence-parallel region needs input: sharded");
  check_follows(shard.param("lora_A"), Layout{std::nullopt, d.axis});
  check_follows(shard.param("lora_B"), kWhole);
  if (bias && rule_of(bias) && bias->assignment.layout != Layout{std::nullopt})
    fail_param(*bias, "the bias of a row-parallel LoRALinear is added after the reduction: layout [null]");
}

Decision decide(const ModuleShard& shard) {
  const ParamShard* w = required_param(shard, "weight");
  const ParamShard* a = required_param(shard, "lora_A");
  const ParamShard* b = required_param(shard, "lora_B");
  check_shapes(*w, *a, *b);
  const Rule* rule = rule_of(w);
  reject_dense_only(rule);
  const Layout& wl = w->assignment.layout;
  if (wl.size() != 2 || (wl[0] && wl[1]))
    fail_param(*w, "a LoRALinear weight is split along one dim at most, got " + layout_str(wl));
  Decision d;
  if (!wl[0] && !wl[1]) {
    reject_option(rule, "output", "applies to a column-parallel LoRALinear (weight [axis, null])");
    reject_option(rule, "input", "applies to a row-parallel LoRALinear (weight [null, axis])");
    check_follows(a, kWhole);
    check_follows(b, kWhole);
    return d;
  }
  d.axis = wl[0] ? *wl[0] : *wl[1];
  d.parts = shard.mesh->axis_size(d.axis);
  if (shard.sequence.on && d.axis != shard.sequence.axis)
    fail_param(*w, "split over '" + d.axis + "' but the sequence is split over '" + shard.sequence.axis + "'");
  const int64_t split_features = wl[0] ? w->assignment.shape[0] : w->assignment.shape[1];
  if (split_features % d.parts != 0)
    fail_param(*w, std::string(wl[0] ? "out_features " : "in_features ") + std::to_string(split_features) +
                       " is not divisible by mesh axis '" + d.axis + "' of size " + std::to_string(d.parts));
  if (wl[0])
    decide_column(shard, rule, d);
  else
    decide_row(shard, rule, d);
  return d;
}

class LoRAPlugin : public LayerPlugin {
 public:
  std::string name() const override { return "lora"; }
  std::vector<std::string> module_types() const override { return {"lora::LoRALinearImpl"}; }
  bool supports_sequence_parallel() const override { return true; }

  void check(ModuleShard& shard) const override {
    const Decision d = decide(shard);
    ParamShard& w = *shard.param("weight");
    ParamShard* bias = shard.param("bias");
    ParamShard& a = *shard.param("lora_A");
    ParamShard& b = *shard.param("lora_B");
    const std::string seq = sequence_note(shard.sequence);
    const std::string reduced = ", gradient all-reduced over '" + d.axis + "'";
    if (d.mode == Mode::Replicated) {
      note_replicated(w, bias);
      a.note = b.note = "replicated" + (shard.sequence.on ? seq + ", gradient all-reduced" : std::string());
    } else if (d.mode == Mode::Column) {
      note_output_split(w, bias, d.axis, d.parts, "column-parallel",
                        std::string("LoRA base, column-parallel, output ") + (d.gather ? "gathered" : "sharded") + seq);
      b.local_shape[0] /= d.parts;
      declare_split(b, 0, d.axis);
      b.note = "LoRA adapter, split with the base's rows";
      a.note = "LoRA adapter, replicated" + reduced;
    } else {
      note_input_split(w, bias, d.axis, d.parts,
                       std::string("LoRA base, row-parallel, input ") +
                           (d.input_sharded ? "sharded" : "split on entry") + seq);
      a.local_shape[1] /= d.parts;
      declare_split(a, 1, d.axis);
      a.note = "LoRA adapter, split with the base's columns";
      b.note = "LoRA adapter, replicated" + reduced;
    }
    warn_no_saving(shard, w, a);
  }

  void apply(ModuleShard& shard) const override {
    const Decision d = decide(shard);
    auto& layer = dynamic_cast<LoRALinearImpl&>(*shard.module);
    if (d.mode == Mode::Replicated) {
      if (shard.sequence.on)
        layer.set_strategy(std::make_shared<ReplicatedSequenceLoRA>(shard.group(shard.sequence.axis), shard.sequence));
      return;
    }
    auto group = shard.group(d.axis);
    const int64_t index = group->rank();
    if (d.mode == Mode::Column) {
      replace_parameter(layer, "weight", shard_of(layer.weight, 0, d.parts, index));
      if (layer.bias.defined()) replace_parameter(layer, "bias", shard_of(layer.bias, 0, d.parts, index));
      replace_parameter(layer, "lora_B", shard_of(layer.lora_B, 0, d.parts, index));
      layer.set_strategy(std::make_shared<ColumnLoRA>(group, d.gather, shard.sequence));
    } else {
      replace_parameter(layer, "weight", shard_of(layer.weight, 1, d.parts, index));
      replace_parameter(layer, "lora_A", shard_of(layer.lora_A, 1, d.parts, index));
      layer.set_strategy(std::make_shared<RowLoRA>(group, d.input_sharded, shard.sequence));
    }
  }

 private:
  // Not an error, but worth saying: an adapter as large as its base trains
  // as many numbers as fine-tuning the base would.
  static void warn_no_saving(ModuleShard& shard, const ParamShard& w, const ParamShard& a) {
    const int64_t out = w.assignment.shape[0], in = w.assignment.shape[1], r = a.assignment.shape[0];
    if (r * (in + out) >= in * out)
      shard.warnings.push_back("module '" + shard.path + "': LoRA rank r " + std::to_string(r) + " trains " +
                               std::to_string(r * (in + out)) + " numbers, no fewer than the base's " +
                               std::to_string(in * out));
  }
};

}  // namespace
}  // namespace lora

SHARDPLAN_LAYER_PLUGIN(lora::LoRAPlugin, "lora")
