// The conv layer plugin: tensor parallelism for shardplan::nn::Conv1d/2d/3d.
// The weight is [out_channels, in_channels / groups, kernel...].
//
//   weight [axis, null, ...]  output-channel parallel (like column-parallel):
//                             each rank owns out_channels/N filters; bias
//                             follows the weight. The input is copied in
//                             (default) or, for a grouped conv whose groups
//                             are divisible by N, may arrive sharded
//                             (`input: sharded`: each rank then holds exactly
//                             the input channels of its own groups). Output
//                             gathered on the channel dim (default) or kept
//                             sharded (`output: sharded`).
//   weight [null, axis, ...]  input-channel parallel (like row-parallel): each
//                             rank owns 1/N of every group's input channels;
//                             input already sharded (`input: sharded`,
//                             groups = 1 only) or split on entry; partial
//                             convolutions all-reduced, bias (replicated)
//                             added once after the reduction.
//   weight [null, null, ...]  replicated.
// Kernel dims are never split: a filter needs its whole window.
//
// Groups: output channel o reads only the input channels of its group, so an
// output-channel shard is one convolution only if it holds whole groups
// (groups divisible by N: g/N groups per rank) or lies inside one group
// (N divisible by groups: the rank convolves that group's input channels with
// groups = 1). Padding modes pad each channel on its own, so they commute with
// any channel split.
#include <ATen/ATen.h>

#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/layer_plugin.h"
#include "shardplan/mappings.h"
#include "shardplan/nn/conv.h"
#include "shardplan/plugin_support.h"
#include "shardplan/shard.h"

namespace shardplan {
namespace {

// Batched input is [N, C, ...], unbatched [C, ...]; the weight has one dim
// per spatial dim plus two, so the channel dim follows from the ranks.
int64_t channel_dim(const at::Tensor& x, const at::Tensor& w) { return x.dim() - w.dim() + 1; }

std::string group_str(const Communicator& g) { return "'" + g.name() + "' (" + std::to_string(g.size()) + ")"; }

class OutChannelParallel : public nn::ConvStrategy {
 public:
  // in_count < 0: the local convolution reads every input channel.
  OutChannelParallel(std::shared_ptr<Communicator> group, bool gather, bool input_sharded, int64_t local_groups,
                     int64_t in_offset, int64_t in_count)
      : group_(std::move(group)), gather_(gather), input_sharded_(input_sharded), local_groups_(local_groups),
        in_offset_(in_offset), in_count_(in_count) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                     const nn::ConvFunction& conv) override {
    const int64_t cdim = channel_dim(x, w);
    at::Tensor xs = x;
    if (!input_sharded_) {
      // copy_to_group before narrowing: the backward all-reduce then sums
      // every rank's (zero-padded) share of the input gradient.
      xs = copy_to_group(x, *group_);
      if (in_count_ >= 0) xs = xs.narrow(cdim, in_offset_, in_count_);
    }
    at::Tensor y = conv(xs, w, b, local_groups_);
    return gather_ ? gather_from_group(y, *group_, cdim) : y;
  }
  std::string describe() const override {
    return "output-channel parallel over " + group_str(*group_) + ", input " +
           (input_sharded_ ? "sharded" : "replicated") + ", output " + (gather_ ? "gathered" : "sharded");
  }

 private:
  std::shared_ptr<Communicator> group_;
  bool gather_, input_sharded_;
  int64_t local_groups_, in_offset_, in_count_;
};

class InChannelParallel : public nn::ConvStrategy {
 public:
  InChannelParallel(std::shared_ptr<Communicator> group, bool input_sharded, int64_t groups)
      : group_(std::move(group)), input_sharded_(input_sharded), groups_(groups) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                     const nn::ConvFunction& conv) override {
    const int64_t cdim = channel_dim(x, w);
    at::Tensor xs = x;
    if (!input_sharded_) {
      if (groups_ == 1) {
        xs = scatter_to_group(x, *group_, cdim);
      } else {
        // The weight holds the rank's piece of every group's channels, so the
        // input is split per group: [.., g * c, ..] -> [.., g, c, ..].
        auto sizes = x.sizes().vec();
        sizes[cdim] = groups_;
        sizes.insert(sizes.begin() + cdim + 1, x.size(cdim) / groups_);
        auto piece = scatter_to_group(x.reshape(sizes), *group_, cdim + 1);
        auto out_sizes = x.sizes().vec();
        out_sizes[cdim] = x.size(cdim) / group_->size();
        xs = piece.reshape(out_sizes);
      }
    }
    at::Tensor y = reduce_from_group(conv(xs, w, at::Tensor(), groups_), *group_);
    if (!b.defined()) return y;
    std::vector<int64_t> bshape(static_cast<size_t>(w.dim() - 1), 1);
    bshape[0] = -1;
    return y + b.view(bshape);
  }
  std::string describe() const override {
    return "input-channel parallel over " + group_str(*group_) + ", input " +
           (input_sharded_ ? "sharded" : "split on entry");
  }

 private:
  std::shared_ptr<Communicator> group_;
  bool input_sharded_;
  int64_t groups_;
};

enum class Mode { Replicated, OutChannel, InChannel };

struct Decision {
  Mode mode = Mode::Replicated;
  std::string axis;
  int64_t parts = 1;
  int64_t groups = 1;
  bool gather = true;
  bool input_sharded = false;
};

// fail_param, but at the option's location when the rule sets it.
[[noreturn]] void fail_option(const ParamShard& p, const RuleOption* o, const std::string& message) {
  if (o) throw PlanError(o->loc, "parameter '" + p.assignment.path + "': " + message);
  fail_param(p, message);
}

int64_t groups_of(const torch::nn::Module* m) {
  if (auto* c = dynamic_cast<const nn::Conv1dImpl*>(m)) return c->options.groups();
  if (auto* c = dynamic_cast<const nn::Conv2dImpl*>(m)) return c->options.groups();
  if (auto* c = dynamic_cast<const nn::Conv3dImpl*>(m)) return c->options.groups();
  return 1;  // no module (shape-only check): groups cannot be validated
}

std::string conv_name(const ModuleShard& shard) {
  const auto pos = shard.type.find("Conv");
  return pos == std::string::npos ? shard.type : shard.type.substr(pos, 6);  // "Conv2d"
}

Decision decide(const ModuleShard& shard) {
  const ParamShard* w = required_param(shard, "weight");
  const ParamShard* b = shard.param("bias");
  const Layout& wl = w->assignment.layout;
  const Rule* rule = rule_of(w);
  const std::string what = "a " + conv_name(shard);
  Decision d;
  d.groups = groups_of(shard.module);
  reject_option(rule, "blocks", "applies to Linear layers; a convolution has no stacked blocks");
  reject_option(rule, "overlap", "applies to Linear layers (dense rules)");
  if (wl.size() < 3) fail_param(*w, what + " weight has at least 3 dims, the layout has " + std::to_string(wl.size()));
  for (size_t i = 2; i < wl.size(); ++i)
    if (wl[i])
      fail_param(*w, "the kernel dims of " + what + " weight cannot be split (a filter needs its whole window), got " +
                         layout_str(wl));
  if (wl[0] && wl[1]) fail_param(*w, what + " weight can be split along one channel dim only, got " + layout_str(wl));

  if (!wl[0] && !wl[1]) {
    if (b && b->assignment.layout.size() == 1 && b->assignment.layout[0])
      fail_param(*b, "the bias of a replicated " + conv_name(shard) + " cannot be split");
    reject_option(rule, "output", "applies to an output-channel parallel convolution (weight [axis, null, ...])");
    reject_option(rule, "input", "applies to a split convolution (weight [axis, null, ...] or [null, axis, ...])");
    return d;
  }
  d.axis = wl[0] ? *wl[0] : *wl[1];
  d.parts = shard.mesh->axis_size(d.axis);
  const int64_t out_c = w->assignment.shape[0], in_per_group = w->assignment.shape[1];
  const std::string axis_desc = "mesh axis '" + d.axis + "' of size " + std::to_string(d.parts);

  if (wl[0]) {
    d.mode = Mode::OutChannel;
    d.gather = output_option_gathered(rule);
    d.input_sharded = input_option_sharded(rule);
    if (out_c % d.parts != 0)
      fail_param(*w, "out_channels " + std::to_string(out_c) + " is not divisible by " + axis_desc);
    if (d.groups % d.parts != 0 && d.parts % d.groups != 0)
      fail_param(*w, "groups " + std::to_string(d.groups) + " and " + axis_desc +
                         ": a rank must hold whole groups (groups divisible by the axis size) or part of one group "
                         "(axis size divisible by groups)");
    if (d.input_sharded && d.groups % d.parts != 0)
      fail_option(*w, rule->option("input"),
                  "input: sharded on an output-channel parallel convolution needs groups (" +
                      std::to_string(d.groups) + ") divisible by " + axis_desc +
                      ", so that each rank's input channels are those of its own groups; every filter of an "
                      "ungrouped convolution reads every input channel");
    if (b && rule_of(b)) {
      const Layout& bl = b->assignment.layout;
      if (bl.size() != 1 || !bl[0] || *bl[0] != d.axis)
        fail_param(*b, "the bias of an output-channel parallel " + conv_name(shard) + " must follow its weight: layout [" +
                           d.axis + "], got " + layout_str(bl));
    }
  } else {
    d.mode = Mode::InChannel;
    reject_option(rule, "output",
                  "applies to an output-channel parallel convolution (weight [axis, null, ...]); this one is "
                  "input-channel parallel");
    d.input_sharded = input_option_sharded(rule);
    if (in_per_group % d.parts != 0)
      fail_param(*w, (d.groups > 1 ? "in_channels per group " : "in_channels ") + std::to_string(in_per_group) +
                         " is not divisible by " + axis_desc);
    if (d.input_sharded && d.groups > 1)
      fail_option(*w, rule->option("input"),
                  "input: sharded means contiguous channel blocks, but an input-channel parallel convolution with "
                  "groups " + std::to_string(d.groups) +
                      " needs a piece of every group; leave the input replicated, or for groups divisible by the axis "
                      "size use layout [" + d.axis + ", null, ...] with input: sharded");
    if (b && b->assignment.layout.size() == 1 && b->assignment.layout[0])
      fail_param(*b, "the bias of an input-channel parallel " + conv_name(shard) +
                         " is added after the reduction and must be replicated ([null])");
  }
  return d;
}

template <class Impl>
void apply_to(Impl& conv, const Decision& d, const std::shared_ptr<Communicator>& group) {
  const int64_t n = d.parts, r = group->rank(), g = d.groups;
  const int64_t in_c = conv.options.in_channels();
  if (d.mode == Mode::OutChannel) {
    replace_parameter(conv, "weight", shard_of(conv.weight, 0, n, r));
    if (conv.bias.defined()) replace_parameter(conv, "bias", shard_of(conv.bias, 0, n, r));
    int64_t local_groups = 1, in_offset = 0, in_count = -1;
    if (g % n == 0) {
      local_groups = g / n;
      if (n > 1) {
        in_offset = r * (in_c / n);
        in_count = in_c / n;
      }
    } else if (g > 1) {  // n % g == 0: this rank's filters lie in group r / (n / g)
      in_offset = (r / (n / g)) * (in_c / g);
      in_count = in_c / g;
    }
    conv.set_strategy(
        std::make_shared<OutChannelParallel>(group, d.gather, d.input_sharded, local_groups, in_offset, in_count));
  } else {
    replace_parameter(conv, "weight", shard_of(conv.weight, 1, n, r));
    conv.set_strategy(std::make_shared<InChannelParallel>(group, d.input_sharded, g));
  }
}

class ConvPlugin : public LayerPlugin {
 public:
  std::string name() const override { return "conv"; }
  std::vector<std::string> module_types() const override {
    return {"shardplan::nn::Conv1dImpl", "shardplan::nn::Conv2dImpl", "shardplan::nn::Conv3dImpl"};
  }

  void check(ModuleShard& shard) const override {
    Decision d = decide(shard);
    ParamShard* w = shard.param("weight");
    ParamShard* b = shard.param("bias");
    if (d.mode == Mode::Replicated)
      note_replicated(*w, b);
    else if (d.mode == Mode::OutChannel)
      note_output_split(*w, b, d.axis, d.parts, "output-channel parallel",
                        std::string("output-channel parallel, ") + (d.input_sharded ? "input sharded, " : "") +
                            "output " + (d.gather ? "gathered" : "sharded"));
    else
      note_input_split(*w, b, d.axis, d.parts,
                       std::string("input-channel parallel, input ") + (d.input_sharded ? "sharded" : "split on entry"));
  }

  void apply(ModuleShard& shard) const override {
    Decision d = decide(shard);
    if (d.mode == Mode::Replicated) return;
    auto group = shard.group(d.axis);
    if (auto* c = dynamic_cast<nn::Conv1dImpl*>(shard.module)) return apply_to(*c, d, group);
    if (auto* c = dynamic_cast<nn::Conv2dImpl*>(shard.module)) return apply_to(*c, d, group);
    if (auto* c = dynamic_cast<nn::Conv3dImpl*>(shard.module)) return apply_to(*c, d, group);
    throw Error("module '" + shard.path + "' of type " + shard.type + " is not a shardplan::nn convolution");
  }
};

}  // namespace
}  // namespace shardplan

SHARDPLAN_LAYER_PLUGIN(shardplan::ConvPlugin, "conv")
