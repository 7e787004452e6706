// The dense layer plugin: tensor parallelism for shardplan::nn::Linear.
//
//   weight [axis, null]  column-parallel: each rank owns out_features/N rows;
//                        bias follows the weight. Output gathered (default)
//                        or kept sharded (`output: sharded`) for a following
//                        row-parallel layer.
//   weight [null, axis]  row-parallel: each rank owns in_features/N columns;
//                        input already sharded (`input: sharded`) or split on
//                        entry (default); partial products all-reduced, bias
//                        (replicated) added once after the reduction.
//   weight [null, null]  replicated (explicitly planned, nothing to do).
// `blocks: k` reads the split dim as k stacked blocks (a fused QKV
// projection) and splits each block, so every rank holds whole heads of q, k
// and v rather than all of q on one rank.
//
// Under sequence parallelism (Megatron's): the input arrives split along the
// sequence. Column-parallel all-gathers the sequence on entry (its backward
// reduce-scatters the input gradient, which replaces the all-reduce);
// row-parallel reduce-scatters its partial sums onto the sequence instead of
// all-reducing them, and its bias, added per sequence part, has its gradient
// all-reduced; a replicated Linear runs on the part with weight and bias
// gradients all-reduced.
//
// `head_dim: D` reads the split dim as attention heads of D rows (columns,
// row-parallel) and refuses a cut through a head; D must be the model's own
// head size where the Linear declares one (out_head_dim, in_head_dim), and
// `head_dim: auto` or no head_dim takes that. With `replicate_heads:
// true` a column-parallel layer with fewer heads H than ranks N (grouped-
// query attention's key/value projections: N divisible by H) holds on rank
// r only the head its query heads read, r*H/N, as Megatron and vLLM
// replicate kv heads: each head on the N/H ranks that read it
// (ShardSplit::shared), its gradient summed over them (copy_to_sharers),
// so the copies stay equal.
//
// `overlap: ring | ring_bidirectional | ring_split` (async tensor parallelism, needs
// sequence parallelism): the column-parallel entry's gather and the
// row-parallel exit's reduce-scatter are computed with the matmul over a
// ring of point-to-point exchanges (shardplan/ring.h), each part's matmul
// while the next part travels, forward and backward.
#include <ATen/ATen.h>
#include <torch/nn/functional/linear.h>

#include "shardplan/communicator.h"
#include "shardplan/layer_plugin.h"
#include "shardplan/mappings.h"
#include "shardplan/nn/linear.h"
#include "shardplan/plugin_support.h"
#include "shardplan/ring.h"
#include "shardplan/shard.h"

namespace shardplan {
namespace {

const char* kLinearType = "shardplan::nn::LinearImpl";

// Gathered output of a blocked column layer arrives rank-major
// ([rank][block][piece]); callers expect block-major ([block][rank][piece]).
at::Tensor block_major(const at::Tensor& y, int64_t ranks, int64_t blocks) {
  auto sizes = y.sizes().vec();
  const int64_t piece = sizes.back() / (ranks * blocks);
  sizes.back() = ranks;
  sizes.push_back(blocks);
  sizes.push_back(piece);
  auto moved = y.view(sizes).transpose(-3, -2);
  return moved.reshape(y.sizes());
}

// `overlap:` none, or the ring's direction.
struct Overlap {
  bool on = false;
  RingDirection direction = RingDirection::Unidirectional;
  std::string name = "none";
};

std::string overlap_note(const Overlap& o) { return o.on ? ", overlap " + o.name : ""; }

class ColumnParallel : public nn::LinearStrategy {
 public:
  ColumnParallel(std::shared_ptr<Communicator> group, bool gather, int64_t blocks, SequenceShard seq, Overlap overlap)
      : group_(std::move(group)), gather_(gather), blocks_(blocks), seq_(std::move(seq)), overlap_(overlap) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) override {
    at::Tensor y;
    if (overlap_.on) {
      y = ring_gather_linear(x, w, b, *group_, seq_.dim, overlap_.direction);
    } else {
      const at::Tensor in = seq_.on ? gather_sequence(x, *group_, seq_.dim) : copy_to_group(x, *group_);
      y = torch::nn::functional::linear(in, w, b);
    }
    if (!gather_) return y;
    y = gather_from_group(y, *group_, -1);
    return blocks_ > 1 && group_->size() > 1 ? block_major(y, group_->size(), blocks_) : y;
  }
  std::string describe() const override {
    return "column-parallel over '" + group_->name() + "' (" + std::to_string(group_->size()) + "), output " +
           (gather_ ? "gathered" : "sharded") + (blocks_ > 1 ? ", " + std::to_string(blocks_) + " blocks" : "") +
           sequence_note(seq_) + overlap_note(overlap_);
  }
  Communicator* sharded_output_group() const override { return gather_ ? nullptr : group_.get(); }

 private:
  std::shared_ptr<Communicator> group_;
  bool gather_;
  int64_t blocks_;
  SequenceShard seq_;
  Overlap overlap_;
};

class RowParallel : public nn::LinearStrategy {
 public:
  RowParallel(std::shared_ptr<Communicator> group, bool input_sharded, SequenceShard seq, Overlap overlap)
      : group_(std::move(group)), input_sharded_(input_sharded), seq_(std::move(seq)), overlap_(overlap) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) override {
    at::Tensor xs = input_sharded_ ? x : scatter_to_group(x, *group_, -1);
    if (!seq_.on) {
      at::Tensor y = reduce_from_group(torch::nn::functional::linear(xs, w, at::Tensor()), *group_);
      return b.defined() ? y + b : y;
    }
    // The bias is added per sequence part, so its gradient is all-reduced.
    at::Tensor y = overlap_.on
                       ? ring_linear_reduce_scatter(xs, w, *group_, seq_.dim, overlap_.direction)
                       : reduce_scatter_sequence(torch::nn::functional::linear(xs, w, at::Tensor()), *group_, seq_.dim);
    return b.defined() ? y + sequence_parallel_param(b, *group_) : y;
  }
  std::string describe() const override {
    return "row-parallel over '" + group_->name() + "' (" + std::to_string(group_->size()) + "), input " +
           (input_sharded_ ? "sharded" : "split on entry") + sequence_note(seq_) + overlap_note(overlap_);
  }
  Communicator* sharded_input_group() const override { return input_sharded_ ? group_.get() : nullptr; }

 private:
  std::shared_ptr<Communicator> group_;
  bool input_sharded_;
  SequenceShard seq_;
  Overlap overlap_;
};

// Fewer heads than ranks: this rank holds the one head its query heads
// read. The input's gradient is all-reduced over the axis as for any
// column-parallel layer; the weight's is summed over the ranks holding the
// same head (copy_to_sharers), so the copies stay equal.
class ReplicatedHeads : public nn::LinearStrategy {
 public:
  ReplicatedHeads(std::shared_ptr<Communicator> group, int64_t heads, SequenceShard seq, Overlap overlap)
      : group_(std::move(group)), heads_(heads), seq_(std::move(seq)), overlap_(overlap) {
    head_ = group_->rank() * heads_ / group_->size();
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) override {
    const at::Tensor wl = copy_to_sharers(w, *group_, heads_);
    const at::Tensor bl = b.defined() ? copy_to_sharers(b, *group_, heads_) : b;
    if (overlap_.on) return ring_gather_linear(x, wl, bl, *group_, seq_.dim, overlap_.direction);
    const at::Tensor in = seq_.on ? gather_sequence(x, *group_, seq_.dim) : copy_to_group(x, *group_);
    return torch::nn::functional::linear(in, wl, bl);
  }
  std::string describe() const override {
    return "heads replicated over '" + group_->name() + "' (" + std::to_string(group_->size()) + "): head " +
           std::to_string(head_) + " of " + std::to_string(heads_) + sequence_note(seq_) + overlap_note(overlap_);
  }

 private:
  std::shared_ptr<Communicator> group_;
  int64_t heads_, head_ = 0;
  SequenceShard seq_;
  Overlap overlap_;
};

// Replicated weights on this rank's part of the sequence.
class ReplicatedSequence : public nn::LinearStrategy {
 public:
  ReplicatedSequence(std::shared_ptr<Communicator> group, SequenceShard seq)
      : group_(std::move(group)), seq_(std::move(seq)) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) override {
    return torch::nn::functional::linear(x, sequence_parallel_param(w, *group_), sequence_parallel_param(b, *group_));
  }
  std::string describe() const override { return "replicated" + sequence_note(seq_) + " over '" + group_->name() + "'"; }

 private:
  std::shared_ptr<Communicator> group_;
  SequenceShard seq_;
};

enum class Mode { Replicated, Column, Row, ReplicatedHeads };

struct Decision {
  Mode mode = Mode::Replicated;
  std::string axis;
  int64_t parts = 1;
  int64_t blocks = 1;
  bool gather = true;
  bool input_sharded = false;
  Overlap overlap;
  int64_t head_dim = 0;  // 0: no `head_dim:`
  int64_t heads = 0;
};

// The head size of the split dim: the rule's `head_dim:`, checked against
// what the model declares (nn::Linear's out_head_dim for a column-parallel
// layer, in_head_dim for a row-parallel one), or the model's for `head_dim:
// auto` and for no `head_dim:` at all; 0 when neither says. A plan's size
// that is not the model's would cut through heads and compute wrong numbers
// without an error (whole "heads" of the plan's size are not the model's).
int64_t head_dim_of(const ModuleShard& shard, const ParamShard& w, const Rule* rule, Mode mode, int64_t features) {
  const auto* linear = dynamic_cast<const nn::LinearImpl*>(shard.module);
  const int64_t model = !linear ? 0 : mode == Mode::Row ? linear->in_head_dim : linear->out_head_dim;
  const RuleOption* o = rule ? rule->option("head_dim") : nullptr;
  if (!o) return model;
  const std::string side = mode == Mode::Row ? "in" : "out";
  if (o->value == "auto") {
    if (model < 1)
      throw PlanError(o->loc, "head_dim: auto, but the model does not say the head size of parameter '" +
                                  w.assignment.path + "' (its shardplan::nn::Linear's " + side +
                                  "_head_dim is 0): write the head size as a number");
    return model;
  }
  const int64_t plan = std::stoll(o->value);
  if (model > 0 && plan != model)
    throw PlanError(o->loc, "head_dim: " + o->value + " is not the model's head size " + std::to_string(model) +
                                " for parameter '" + w.assignment.path + "' (" + side + "_features " +
                                std::to_string(features) + ": " + std::to_string(features / model) + " heads of " +
                                std::to_string(model) + "); write head_dim: auto to take the model's");
  return plan;
}

// `head_dim:` and `replicate_heads:` on a split dim of `features` (out or in
// features): whole heads per rank, or with replicate_heads (column-parallel
// only) whole ranks per head.
void decide_heads(const ModuleShard& shard, const ParamShard& w, const Rule* rule, int64_t features, Decision& d) {
  const bool replicate = rule && rule->option_or("replicate_heads", "false") == "true";
  d.head_dim = head_dim_of(shard, w, rule, d.mode, features);
  if (!d.head_dim) {
    if (replicate) reject_option(rule, "replicate_heads", "needs head_dim: the size of one head");
    return;
  }
  if (d.mode == Mode::Row && replicate)
    reject_option(rule, "replicate_heads", "applies to a column-parallel Linear (weight [axis, null])");
  const std::string dim = d.mode == Mode::Row ? "in_features " : "out_features ";
  if (features % (d.blocks * d.head_dim) != 0)
    fail_param(w, dim + std::to_string(features) + (d.blocks > 1 ? " in " + std::to_string(d.blocks) + " blocks" : "") +
                      " is not a whole number of heads of head_dim " + std::to_string(d.head_dim));
  d.heads = features / d.blocks / d.head_dim;
  if (d.heads % d.parts == 0) return;
  const std::string what = std::to_string(d.heads) + " heads of " + std::to_string(d.head_dim) + " (" + dim +
                           std::to_string(features) + ") cannot be split over mesh axis '" + d.axis + "' of size " +
                           std::to_string(d.parts);
  if (!replicate)
    fail_param(w, what + ": the heads must divide among the ranks" +
                      (d.mode == Mode::Row ? std::string() : " (or, with replicate_heads: true, the ranks among the heads)"));
  if (d.blocks != 1 || d.parts % d.heads != 0)
    fail_param(w, what + ": the heads must divide among the ranks, or the ranks among the heads (replicate_heads)" +
                      (d.blocks != 1 ? ", and replicated heads take blocks: 1" : ""));
  if (d.gather)
    fail_param(w, "replicated heads (" + std::to_string(d.heads) + " heads over " + std::to_string(d.parts) +
                      " ranks) must stay with the rank that computed them: output: sharded");
  d.mode = Mode::ReplicatedHeads;
}

Decision decide(const ModuleShard& shard) {
  const ParamShard* w = required_param(shard, "weight");
  const ParamShard* b = shard.param("bias");
  const Layout& wl = w->assignment.layout;
  Decision d;
  const Rule* rule = rule_of(w);
  if (wl.size() != 2) fail_param(*w, "a Linear weight has 2 dims, the layout has " + std::to_string(wl.size()));
  if (wl[0] && wl[1]) fail_param(*w, "a Linear weight can be split along one dim only, got " + layout_str(wl));

  if (!wl[0] && !wl[1]) {
    if (b && b->assignment.layout.size() == 1 && b->assignment.layout[0])
      fail_param(*b, "the bias of a replicated Linear cannot be split");
    reject_option(rule, "output", "applies to a column-parallel Linear (weight [axis, null])");
    reject_option(rule, "input", "applies to a row-parallel Linear (weight [null, axis])");
    if (rule && rule->option_or("overlap", "none") != "none")
      reject_option(rule, "overlap", "applies to a column- or row-parallel Linear; this one is replicated");
    return d;
  }
  d.axis = wl[0] ? *wl[0] : *wl[1];
  if (rule) {
    d.overlap.name = rule->option_or("overlap", "none");
    d.overlap.on = d.overlap.name != "none";
    if (d.overlap.name == "ring_bidirectional") d.overlap.direction = RingDirection::Bidirectional;
    if (d.overlap.name == "ring_split") d.overlap.direction = RingDirection::Split;
  }
  if (d.overlap.on && !shard.sequence.on)
    reject_option(rule, "overlap",
                  "needs sequence parallelism (the plan's sequence_parallel): the ring passes parts of the sequence");
  if (shard.sequence.on && d.axis != shard.sequence.axis)
    fail_param(*w, "split over '" + d.axis + "' but the sequence is split over '" + shard.sequence.axis +
                       "': under sequence parallelism a Linear must be split over the sequence axis (or have "
                       "sequence_parallel: false)");
  d.parts = shard.mesh->axis_size(d.axis);
  if (rule) d.blocks = std::stoll(rule->option_or("blocks", "1"));
  const int64_t out_f = w->assignment.shape[0], in_f = w->assignment.shape[1];

  if (wl[0]) {
    d.mode = Mode::Column;
    reject_option(rule, "input", "applies to a row-parallel Linear (weight [null, axis]); this one is column-parallel");
    d.gather = output_option_gathered(rule);
    if (shard.sequence.on && d.gather)
      fail_param(*w, "a column-parallel Linear in the sequence-parallel region gathers the whole sequence on entry, "
                     "so its output must stay split by features (output: sharded) for a row-parallel Linear, a "
                     "vocab-parallel loss or a sampler to take; or give it sequence_parallel: false");
    decide_heads(shard, *w, rule, out_f, d);
    if (d.mode == Mode::Column && out_f % (d.blocks * d.parts) != 0)
      fail_param(*w, "out_features " + std::to_string(out_f) +
                         (d.blocks > 1 ? " in " + std::to_string(d.blocks) + " blocks" : "") +
                         " is not divisible by mesh axis '" + d.axis + "' of size " + std::to_string(d.parts));
    if (b && rule_of(b)) {
      const Layout& bl = b->assignment.layout;
      if (bl.size() != 1 || !bl[0] || *bl[0] != d.axis)
        fail_param(*b, "the bias of a column-parallel Linear must follow its weight: layout [" + d.axis + "], got " +
                           layout_str(bl));
    }
  } else {
    d.mode = Mode::Row;
    reject_option(rule, "output", "applies to a column-parallel Linear (weight [axis, null]); this one is row-parallel");
    if (d.blocks != 1) reject_option(rule, "blocks", "applies to column-parallel layers only");
    d.input_sharded = input_option_sharded(rule);
    if (shard.sequence.on && !d.input_sharded)
      fail_param(*w, "a row-parallel Linear in the sequence-parallel region needs its input split by features "
                     "(input: sharded, from a column-parallel Linear), since what arrives is split along the "
                     "sequence; or give it sequence_parallel: false");
    decide_heads(shard, *w, rule, in_f, d);
    if (in_f % d.parts != 0)
      fail_param(*w, "in_features " + std::to_string(in_f) + " is not divisible by mesh axis '" + d.axis + "' of size " +
                         std::to_string(d.parts));
    if (b && b->assignment.layout.size() == 1 && b->assignment.layout[0])
      fail_param(*b, "the bias of a row-parallel Linear is added after the reduction and must be replicated ([null])");
  }
  return d;
}

class DensePlugin : public LayerPlugin {
 public:
  std::string name() const override { return "dense"; }
  std::vector<std::string> module_types() const override { return {kLinearType}; }

  void check(ModuleShard& shard) const override {
    Decision d = decide(shard);
    ParamShard* w = shard.param("weight");
    ParamShard* b = shard.param("bias");
    const std::string seq = sequence_note(shard.sequence);
    if (d.mode == Mode::Replicated) {
      note_replicated(*w, b);
      if (shard.sequence.on) {
        w->note += seq + ", gradient all-reduced";
        if (b) b->note = w->note;
      }
    } else if (d.mode == Mode::ReplicatedHeads) {
      note_replicated_heads(*w, b, d, seq);
    } else if (d.mode == Mode::Column) {
      note_output_split(*w, b, d.axis, d.parts, "column-parallel",
                        std::string("column-parallel, output ") + (d.gather ? "gathered" : "sharded") + seq +
                            overlap_note(d.overlap),
                        d.blocks);
    } else {
      note_input_split(*w, b, d.axis, d.parts,
                       std::string("row-parallel, input ") + (d.input_sharded ? "sharded" : "split on entry") + seq +
                           overlap_note(d.overlap));
      if (b && shard.sequence.on) b->note = "replicated, added per sequence part, gradient all-reduced";
    }
    warn_overlap(shard, d, *w);
  }

  bool supports_sequence_parallel() const override { return true; }

  // One head per rank, each head on parts/heads ranks: the split says so
  // (checkpoints write each head once and collect it from its first holder).
  static void note_replicated_heads(ParamShard& w, ParamShard* b, const Decision& d, const std::string& seq) {
    const int64_t shared = d.parts / d.heads;
    const std::string note = "heads replicated: " + std::to_string(d.heads) + " heads over " +
                             std::to_string(d.parts) + " ranks of '" + d.axis + "', rank r holds head r*" +
                             std::to_string(d.heads) + "/" + std::to_string(d.parts) + " (each on " +
                             std::to_string(shared) + " ranks, gradient summed over them)" + seq +
                             overlap_note(d.overlap);
    for (ParamShard* p : {&w, b}) {
      if (!p) continue;
      p->local_shape[0] = d.head_dim;
      declare_split(*p, 0, d.axis, 1, shared);
      p->note = note;
    }
  }

  // When a ring cannot hide anything: docs/BENCHMARKS.md, "async tensor
  // parallelism", has the measurements behind the threshold.
  static void warn_overlap(ModuleShard& shard, const Decision& d, const ParamShard& w) {
    if (!d.overlap.on) return;
    const std::string where = "module '" + shard.path + "' (overlap: " + d.overlap.name + "): ";
    if (d.parts == 1) {
      shard.warnings.push_back(where + "mesh axis '" + d.axis + "' has one rank, nothing to overlap");
      return;
    }
    if (d.overlap.direction == RingDirection::Bidirectional && d.parts == 2)
      shard.warnings.push_back(where + "at 2 ranks a bidirectional ring is a ring (one step either way)");
    const int64_t local = w.local_shape[0] * w.local_shape[1];
    if (local < kRingWorthElements)
      shard.warnings.push_back(where + "its weight shard has " + std::to_string(local) + " elements, under " +
                               std::to_string(kRingWorthElements) +
                               ": each ring step's matmul is likely shorter than the exchange's latency, so the "
                               "ring is slower than one collective");
  }
  static constexpr int64_t kRingWorthElements = 1 << 18;

  void apply(ModuleShard& shard) const override {
    Decision d = decide(shard);
    auto& linear = dynamic_cast<nn::LinearImpl&>(*shard.module);
    if (d.mode == Mode::Replicated) {
      if (shard.sequence.on)
        linear.set_strategy(std::make_shared<ReplicatedSequence>(shard.group(shard.sequence.axis), shard.sequence));
      return;
    }
    auto group = shard.group(d.axis);
    const int64_t index = group->rank();
    if (d.mode == Mode::ReplicatedHeads) {
      const int64_t head = index * d.heads / d.parts;
      replace_parameter(linear, "weight", shard_of(linear.weight, 0, d.heads, head));
      if (linear.bias.defined()) replace_parameter(linear, "bias", shard_of(linear.bias, 0, d.heads, head));
      linear.set_strategy(std::make_shared<ReplicatedHeads>(group, d.heads, shard.sequence, d.overlap));
    } else if (d.mode == Mode::Column) {
      replace_parameter(linear, "weight", shard_of(linear.weight, 0, d.parts, index, d.blocks));
      if (linear.bias.defined())
        replace_parameter(linear, "bias", shard_of(linear.bias, 0, d.parts, index, d.blocks));
      linear.set_strategy(std::make_shared<ColumnParallel>(group, d.gather, d.blocks, shard.sequence, d.overlap));
    } else {
      replace_parameter(linear, "weight", shard_of(linear.weight, 1, d.parts, index));
      linear.set_strategy(std::make_shared<RowParallel>(group, d.input_sharded, shard.sequence, d.overlap));
    }
  }
};

}  // namespace
}  // namespace shardplan

SHARDPLAN_LAYER_PLUGIN(shardplan::DensePlugin, "dense")
