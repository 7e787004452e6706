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
#include <ATen/ATen.h>
#include <torch/nn/functional/linear.h>

#include "shardplan/communicator.h"
#include "shardplan/layer_plugin.h"
#include "shardplan/mappings.h"
#include "shardplan/nn/linear.h"
#include "shardplan/plugin_support.h"
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

class ColumnParallel : public nn::LinearStrategy {
 public:
  ColumnParallel(std::shared_ptr<Communicator> group, bool gather, int64_t blocks)
      : group_(std::move(group)), gather_(gather), blocks_(blocks) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) override {
    at::Tensor y = torch::nn::functional::linear(copy_to_group(x, *group_), w, b);
    if (!gather_) return y;
    y = gather_from_group(y, *group_, -1);
    return blocks_ > 1 && group_->size() > 1 ? block_major(y, group_->size(), blocks_) : y;
  }
  std::string describe() const override {
    return "column-parallel over '" + group_->name() + "' (" + std::to_string(group_->size()) + "), output " +
           (gather_ ? "gathered" : "sharded") + (blocks_ > 1 ? ", " + std::to_string(blocks_) + " blocks" : "");
  }
  Communicator* sharded_output_group() const override { return gather_ ? nullptr : group_.get(); }

 private:
  std::shared_ptr<Communicator> group_;
  bool gather_;
  int64_t blocks_;
};

class RowParallel : public nn::LinearStrategy {
 public:
  RowParallel(std::shared_ptr<Communicator> group, bool input_sharded)
      : group_(std::move(group)), input_sharded_(input_sharded) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) override {
    at::Tensor xs = input_sharded_ ? x : scatter_to_group(x, *group_, -1);
    at::Tensor y = reduce_from_group(torch::nn::functional::linear(xs, w, at::Tensor()), *group_);
    return b.defined() ? y + b : y;
  }
  std::string describe() const override {
    return "row-parallel over '" + group_->name() + "' (" + std::to_string(group_->size()) + "), input " +
           (input_sharded_ ? "sharded" : "split on entry");
  }
  Communicator* sharded_input_group() const override { return input_sharded_ ? group_.get() : nullptr; }

 private:
  std::shared_ptr<Communicator> group_;
  bool input_sharded_;
};

enum class Mode { Replicated, Column, Row };

struct Decision {
  Mode mode = Mode::Replicated;
  std::string axis;
  int64_t parts = 1;
  int64_t blocks = 1;
  bool gather = true;
  bool input_sharded = false;
};

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
    return d;
  }
  d.axis = wl[0] ? *wl[0] : *wl[1];
  d.parts = shard.mesh->axis_size(d.axis);
  if (rule) d.blocks = std::stoll(rule->option_or("blocks", "1"));
  const int64_t out_f = w->assignment.shape[0], in_f = w->assignment.shape[1];

  if (wl[0]) {
    d.mode = Mode::Column;
    reject_option(rule, "input", "applies to a row-parallel Linear (weight [null, axis]); this one is column-parallel");
    d.gather = output_option_gathered(rule);
    if (out_f % (d.blocks * d.parts) != 0)
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
    if (d.mode == Mode::Replicated)
      note_replicated(*w, b);
    else if (d.mode == Mode::Column)
      note_output_split(*w, b, d.axis, d.parts, "column-parallel",
                        std::string("column-parallel, output ") + (d.gather ? "gathered" : "sharded"), d.blocks);
    else
      note_input_split(*w, b, d.axis, d.parts,
                       std::string("row-parallel, input ") + (d.input_sharded ? "sharded" : "split on entry"));
  }

  void apply(ModuleShard& shard) const override {
    Decision d = decide(shard);
    if (d.mode == Mode::Replicated) return;
    auto& linear = dynamic_cast<nn::LinearImpl&>(*shard.module);
    auto group = shard.group(d.axis);
    const int64_t index = group->rank();
    if (d.mode == Mode::Column) {
      replace_parameter(linear, "weight", shard_of(linear.weight, 0, d.parts, index, d.blocks));
      if (linear.bias.defined())
        replace_parameter(linear, "bias", shard_of(linear.bias, 0, d.parts, index, d.blocks));
      linear.set_strategy(std::make_shared<ColumnParallel>(group, d.gather, d.blocks));
    } else {
      replace_parameter(linear, "weight", shard_of(linear.weight, 1, d.parts, index));
      linear.set_strategy(std::make_shared<RowParallel>(group, d.input_sharded));
    }
  }
};

}  // namespace
}  // namespace shardplan

SHARDPLAN_LAYER_PLUGIN(shardplan::DensePlugin, "dense")
