// The mha layer plugin: head-parallel shardplan::nn::MultiheadAttention
// (Megatron's ParallelAttention).
//
//   in_proj_weight [axis, null]        each rank owns H/N whole heads: their
//   (or q/k/v_proj_weight [axis, null]) rows of q, of k and of v (in_proj_weight
//                                      is read as the 3 stacked blocks q, k, v);
//                                      in_proj_bias [axis] and bias_k/bias_v
//                                      [null, null, axis] follow.
//   all [null, ...]                    replicated (explicitly planned).
//
// Query, key and value enter whole (their gradients are all-reduced), each
// rank attends with its own heads, and the context leaves split by heads along
// the embed dim. out_proj is a child Linear with a rule of its own, sharded by
// the dense plugin: `out_proj.weight [null, axis]` with `input: sharded`
// (row-parallel) takes the split context as it is, so attention costs one
// all-reduce forward and one backward. Any other out_proj layout gets the
// context gathered first, which is correct but moves more bytes.
// Attention weights, when asked for, are averaged over all heads (the local
// sums all-reduced, divided by num_heads) or gathered per head.
// Under sequence parallelism query, key and value arrive split along the
// sequence (dim 0 of [L, N, E]): each is all-gathered on entry (one gather
// when they are the same tensor, as in self-attention), whose backward
// reduce-scatters their gradients, and out_proj must be row-parallel on the
// split context: it reduce-scatters the output back onto the sequence.
// Incremental decoding (MultiheadAttentionImpl::forward_cached) needs nothing
// here: attend() appends to the key/value cache what it computes, this
// rank's heads, so each rank's cache holds 1/N of the keys and values.
#include <ATen/ATen.h>

#include "shardplan/communicator.h"
#include "shardplan/layer_plugin.h"
#include "shardplan/mappings.h"
#include "shardplan/nn/multihead_attention.h"
#include "shardplan/plugin_support.h"
#include "shardplan/random.h"
#include "shardplan/shard.h"

namespace shardplan {
namespace {

const char* kAttentionType = "shardplan::nn::MultiheadAttentionImpl";

class HeadParallel : public nn::MultiheadAttentionStrategy {
 public:
  HeadParallel(std::shared_ptr<Communicator> group, std::string axis, int64_t num_heads, std::string path,
               SequenceShard seq)
      : group_(std::move(group)),
        axis_(std::move(axis)),
        num_heads_(num_heads),
        path_(std::move(path)),
        seq_(std::move(seq)) {}

  std::tuple<at::Tensor, at::Tensor> forward(nn::MultiheadAttentionImpl& m, const at::Tensor& query,
                                             const at::Tensor& key, const at::Tensor& value,
                                             const at::Tensor& key_padding_mask, bool need_weights,
                                             const at::Tensor& attn_mask, bool average_attn_weights) override {
    Communicator& g = *group_;
    const int64_t local_heads = num_heads_ / g.size();
    // Every rank's partial result depends on the whole query, key, value and
    // mask, so each of their gradients is the sum over the group.
    at::Tensor q, k, v;
    if (seq_.on) {
      if (query.dim() < 2 || (seq_.dim != 0 && seq_.dim != -query.dim()))
        throw Error("MultiheadAttention '" + path_ + "' takes [L, N, E] (sequence first), but the plan's sequence "
                    "dim is " + std::to_string(seq_.dim) + " for a " + std::to_string(query.dim()) +
                    "-dim query: give its rule sequence_dim: 0");
      q = gather_sequence(query, g, 0);
      k = key.is_same(query) ? q : gather_sequence(key, g, 0);
      v = value.is_same(query) ? q : value.is_same(key) ? k : gather_sequence(value, g, 0);
    } else {
      q = copy_to_group(query, g), k = copy_to_group(key, g), v = copy_to_group(value, g);
    }
    at::Tensor mask = attn_mask;
    if (mask.defined() && mask.is_floating_point()) mask = copy_to_group(mask, g);
    if (mask.defined() && mask.dim() == 3) {
      const int64_t bsz = q.dim() == 3 ? q.size(1) : 0;
      if (mask.size(0) != bsz * num_heads_)
        throw Error("MultiheadAttention '" + path_ + "': a 3-D attn_mask must be [N * num_heads, L, S] with N = " +
                    std::to_string(bsz) + " and num_heads = " + std::to_string(num_heads_) + ", got first dim " +
                    std::to_string(mask.size(0)));
      mask = mask.view({bsz, num_heads_, mask.size(1), mask.size(2)})
                 .narrow(1, g.rank() * local_heads, local_heads)
                 .reshape({bsz * local_heads, mask.size(1), mask.size(2)});
    }
    at::Tensor context, weights;
    {
      // This rank's heads are its own: their dropout masks must differ from
      // the other ranks'.
      RngFork fork(axis_);
      std::tie(context, weights) = m.attend(q, k, v, key_padding_mask, mask);
    }

    Communicator* wanted = m.out_proj->strategy() ? m.out_proj->strategy()->sharded_input_group() : nullptr;
    at::Tensor output;
    if (wanted == group_.get()) {
      output = m.out_proj->forward(context);
    } else if (seq_.on) {
      throw Error("MultiheadAttention '" + path_ + "' is sequence-parallel, so out_proj must be row-parallel on its "
                  "heads: give out_proj.weight the layout [null, " + axis_ + "] and input: sharded");
    } else if (wanted && wanted->size() > 1) {
      throw Error("MultiheadAttention '" + path_ + "': its heads are split over '" + g.name() +
                  "' but out_proj expects its input split over '" + wanted->name() +
                  "': give out_proj.weight the layout [null, " + axis_ + "]");
    } else {
      output = m.out_proj->forward(gather_from_group(context, g, -1));
    }
    if (!need_weights) return std::make_tuple(output, at::Tensor());
    weights = weights.view({q.size(1), local_heads, q.size(0), weights.size(-1)});
    if (average_attn_weights)
      weights = reduce_from_group(weights.sum(/*dim=*/1), g) / num_heads_;
    else
      weights = gather_from_group(weights, g, 1);
    return std::make_tuple(output, weights);
  }

  int64_t sequence_parts() const override { return seq_.on ? group_->size() : 1; }

  std::string describe() const override {
    return "head-parallel over '" + group_->name() + "' (" + std::to_string(group_->size()) + "): " +
           std::to_string(num_heads_ / group_->size()) + " of " + std::to_string(num_heads_) + " heads per rank" +
           (seq_.on ? ", sequence-parallel" : "");
  }

 private:
  std::shared_ptr<Communicator> group_;
  std::string axis_;
  int64_t num_heads_;
  std::string path_;
  SequenceShard seq_;
};

struct Decision {
  bool split = false;
  std::string axis;
  int64_t parts = 1;
  int64_t num_heads = 0;  // 0: unknown (shape-only check without the module)
  std::vector<const ParamShard*> weights;  // in_proj_weight, or q/k/v_proj_weight
  const ParamShard* split_by = nullptr;    // the weight whose rule set the axis
};

int64_t heads_of(const torch::nn::Module* m) {
  auto* a = dynamic_cast<const nn::MultiheadAttentionImpl*>(m);
  return a ? a->options.num_heads() : 0;
}

bool is_split(const Layout& l) {
  for (const auto& e : l)
    if (e) return true;
  return false;
}

Decision decide(const ModuleShard& shard) {
  Decision d;
  if (const ParamShard* w = shard.param("in_proj_weight"))
    d.weights.push_back(w);
  else
    for (const char* name : {"q_proj_weight", "k_proj_weight", "v_proj_weight"})
      d.weights.push_back(required_param(shard, name));

  for (const auto& p : shard.params) {
    const Rule* rule = rule_of(&p);
    reject_option(rule, "output",
                  "does not apply to MultiheadAttention: its output is whole on every rank (out_proj's own rule "
                  "says how out_proj is split)");
    reject_option(rule, "input", "does not apply to MultiheadAttention: query, key and value enter whole");
    reject_option(rule, "overlap",
                  "applies to Linear layers (dense rules): give it to out_proj's rule; q, k and v are gathered once");
    const RuleOption* blocks = rule ? rule->option("blocks") : nullptr;
    if (blocks && !((p.name == "in_proj_weight" || p.name == "in_proj_bias") && blocks->value == "3"))
      throw PlanError(blocks->loc, "option 'blocks' does not apply to '" + p.assignment.path +
                                       "': the mha plugin splits in_proj_weight and in_proj_bias as their 3 "
                                       "blocks q, k, v by itself (blocks: 3 is accepted there, and redundant)");
  }

  for (const ParamShard* w : d.weights) {
    const Layout& l = w->assignment.layout;
    if (l.size() != 2) fail_param(*w, "a projection weight has 2 dims, the layout has " + std::to_string(l.size()));
    if (l[1])
      fail_param(*w, "multi-head attention is split by heads, i.e. by the rows of " + w->name +
                         ": layout [axis, null]; its input features cannot be split, got " + layout_str(l));
    if (l[0] && !d.split_by) {
      d.split_by = w;
      d.axis = *l[0];
    }
  }

  if (!d.split_by) {
    if (shard.sequence.on)
      fail_param(*d.weights[0], "attention needs the whole sequence: in the sequence-parallel region it must be "
                                "head-parallel over '" + shard.sequence.axis + "' (layout [" + shard.sequence.axis +
                                    ", null]), or have sequence_parallel: false");
    for (const auto& p : shard.params)
      if (is_split(p.assignment.layout))
        fail_param(p, "cannot be split while the attention heads are not: give " + d.weights[0]->assignment.path +
                          " the layout [axis, null] to split the heads (and this follows)");
    return d;
  }

  d.split = true;
  d.parts = shard.mesh->axis_size(d.axis);
  if (shard.sequence.on && d.axis != shard.sequence.axis)
    fail_param(*d.split_by, "heads split over '" + d.axis + "' but the sequence is split over '" +
                                shard.sequence.axis + "': they must be one axis (or sequence_parallel: false)");
  for (const ParamShard* w : d.weights)
    if (!w->assignment.layout[0] || *w->assignment.layout[0] != d.axis)
      fail_param(*w, "the heads are split over '" + d.axis + "' by " + d.split_by->assignment.path + ", so " +
                         w->name + " needs the layout [" + d.axis + ", null] too, got " +
                         layout_str(w->assignment.layout));
  d.num_heads = heads_of(shard.module);
  if (d.num_heads > 0) {
    if (d.num_heads % d.parts != 0)
      fail_param(*d.split_by, "num_heads " + std::to_string(d.num_heads) + " is not divisible by mesh axis '" +
                                  d.axis + "' of size " + std::to_string(d.parts) + " (each rank owns whole heads)");
  } else {
    const int64_t rows = d.split_by->assignment.shape[0] / (d.split_by->name == "in_proj_weight" ? 3 : 1);
    if (rows % d.parts != 0)
      fail_param(*d.split_by, "embed_dim " + std::to_string(rows) + " is not divisible by mesh axis '" + d.axis +
                                  "' of size " + std::to_string(d.parts));
  }

  if (const ParamShard* b = shard.param("in_proj_bias"))
    if (rule_of(b) && (b->assignment.layout.size() != 1 || !b->assignment.layout[0] ||
                       *b->assignment.layout[0] != d.axis))
      fail_param(*b, "in_proj_bias must follow the heads: layout [" + d.axis + "], got " +
                         layout_str(b->assignment.layout));
  for (const char* name : {"bias_k", "bias_v"})
    if (const ParamShard* b = shard.param(name)) {
      const Layout& l = b->assignment.layout;
      if (rule_of(b) && (l.size() != 3 || l[0] || l[1] || !l[2] || *l[2] != d.axis))
        fail_param(*b, std::string(name) + " must follow the heads: layout [null, null, " + d.axis + "], got " +
                           layout_str(l));
    }
  return d;
}

class MhaPlugin : public LayerPlugin {
 public:
  std::string name() const override { return "mha"; }
  std::vector<std::string> module_types() const override { return {kAttentionType}; }

  bool supports_sequence_parallel() const override { return true; }

  void check(ModuleShard& shard) const override {
    Decision d = decide(shard);
    if (!d.split) {
      for (auto& p : shard.params) p.note = "replicated";
      return;
    }
    const std::string heads =
        d.num_heads > 0 ? std::to_string(d.num_heads / d.parts) + " of " + std::to_string(d.num_heads) + " heads"
                        : "1/" + std::to_string(d.parts) + " of the heads";
    for (auto& p : shard.params) {
      if (p.name == "bias_k" || p.name == "bias_v") {
        p.local_shape[2] /= d.parts;
        declare_split(p, 2, d.axis);
      } else {
        p.local_shape[0] /= d.parts;
        // in_proj holds q, k and v stacked: each is split by heads.
        declare_split(p, 0, d.axis, p.name == "in_proj_weight" || p.name == "in_proj_bias" ? 3 : 1);
      }
      if (p.name == "in_proj_weight")
        p.note = "head-parallel, " + heads + " (rows of q, k and v)" +
                 (shard.sequence.on ? ", sequence gathered on entry" : "");
      else if (p.name == "q_proj_weight" || p.name == "k_proj_weight" || p.name == "v_proj_weight")
        p.note = "head-parallel, " + heads;
      else
        p.note = rule_of(&p) ? "head-parallel" : "head-parallel, follows the heads";
    }
  }

  void apply(ModuleShard& shard) const override {
    Decision d = decide(shard);
    if (!d.split) return;
    auto& attention = dynamic_cast<nn::MultiheadAttentionImpl&>(*shard.module);
    auto group = shard.group(d.axis);
    const int64_t index = group->rank();
    if (attention.in_proj_weight.defined())
      replace_parameter(attention, "in_proj_weight", shard_of(attention.in_proj_weight, 0, d.parts, index, 3));
    if (attention.q_proj_weight.defined()) {
      replace_parameter(attention, "q_proj_weight", shard_of(attention.q_proj_weight, 0, d.parts, index));
      replace_parameter(attention, "k_proj_weight", shard_of(attention.k_proj_weight, 0, d.parts, index));
      replace_parameter(attention, "v_proj_weight", shard_of(attention.v_proj_weight, 0, d.parts, index));
    }
    if (attention.in_proj_bias.defined())
      replace_parameter(attention, "in_proj_bias", shard_of(attention.in_proj_bias, 0, d.parts, index, 3));
    if (attention.bias_k.defined()) replace_parameter(attention, "bias_k", shard_of(attention.bias_k, 2, d.parts, index));
    if (attention.bias_v.defined()) replace_parameter(attention, "bias_v", shard_of(attention.bias_v, 2, d.parts, index));
    attention.set_strategy(
        std::make_shared<HeadParallel>(group, d.axis, attention.options.num_heads(), shard.path, shard.sequence));
  }
};

}  // namespace
}  // namespace shardplan

SHARDPLAN_LAYER_PLUGIN(shardplan::MhaPlugin, "mha")
