// The lstm layer plugin: tensor parallelism for shardplan::nn::LSTM.
//
//   weight_ih_*/weight_hh_* [axis, null], biases [axis] (or no rule: they
//   follow)   hidden-parallel: rank r owns hidden units
//             [r*H/N, (r+1)*H/N) of every layer and direction, i.e. that
//             slice of each of the four gate blocks i, f, g, o (torch's
//             order), not a quarter of the stacked matrix.
//   all null  replicated.
// Every weight of the module is split alike: a layer's gates need h_{t-1} and
// its input whole, so a mixed plan would only add exchanges.
//
// Per layer and direction, rank r computes its gate rows from the full input
// and the full previous hidden state, keeps its slice of c, and all-gathers its
// slice of h every time step, since the next step's W_hh rows read all of h.
// Gradients: every consumer of a gathered h (the next step's W_hh rows, the
// next layer's W_ih rows) is a different set of rows on each rank, so the
// gathered h's gradient is a sum of per-rank partials: the per-step exchange is
// all_gather_from_group (backward reduce-scatter). What the caller receives
// (output, h_n, c_n) is whole and identical on every rank, so its gradient is
// too, and each rank keeps its own slice of it: gather semantics (backward
// chunk). The output and h_n reuse the values gathered in the recurrence
// instead of gathering them again. Inputs entering row-split products are
// copied in (x and h0: backward all-reduce); c0 is scattered. Dropout between
// layers acts on whole, replicated layer outputs, so its mask comes from the
// RNG tracker's replicated stream (shardplan/random.h): the same on every rank.
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <set>

#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/layer_plugin.h"
#include "shardplan/mappings.h"
#include "shardplan/nn/lstm.h"
#include "shardplan/plugin_support.h"
#include "shardplan/random.h"
#include "shardplan/shard.h"

namespace shardplan {
namespace {

constexpr int64_t kGates = 4;  // i, f, g, o

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Forward: `gathered`, the values of `local` already all-gathered along the
// last dim (computed for the recurrence). Backward: this rank's chunk of the
// incoming gradient, as gather_from_group's backward, without a second
// all-gather in the forward.
struct AsGathered : torch::autograd::Function<AsGathered> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& /*local*/, const at::Tensor& gathered,
                            int64_t parts, int64_t index) {
    ctx->saved_data["parts"] = parts;
    ctx->saved_data["index"] = index;
    return gathered;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t parts = ctx->saved_data["parts"].toInt(), index = ctx->saved_data["index"].toInt();
    return {grads[0].chunk(parts, -1)[index].contiguous(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor as_gathered(const at::Tensor& local, const at::Tensor& gathered, const Communicator& g) {
  if (g.size() == 1) return local;
  return AsGathered::apply(local, gathered.detach(), static_cast<int64_t>(g.size()), static_cast<int64_t>(g.rank()));
}

class HiddenParallel : public nn::LSTMStrategy {
 public:
  HiddenParallel(std::shared_ptr<Communicator> group, std::string path)
      : group_(std::move(group)), path_(std::move(path)) {}

  nn::LSTMOutput forward(const nn::LSTMImpl& lstm, const at::Tensor& input,
                         const std::tuple<at::Tensor, at::Tensor>& hx) override {
    const auto& o = lstm.options;
    const int64_t layers = o.num_layers(), dirs = o.bidirectional() ? 2 : 1;
    const bool dropout = o.dropout() > 0 && lstm.is_training() && layers > 1;
    if (dropout && group_->size() > 1 && !current_rng_tracker())
      throw Error("LSTM '" + path_ + "': dropout " + std::to_string(o.dropout()) +
                  " between layers in training mode needs the same mask on every rank, but no RNG tracker is "
                  "current on this thread (parallelize() sets one on its calling thread; see shardplan/random.h); "
                  "run the forward there, use eval() or dropout 0, or leave this LSTM replicated");
    Communicator& g = *group_;
    at::Tensor layer_input = copy_to_group(o.batch_first() ? input.transpose(0, 1) : input, g);
    const at::Tensor h0 = copy_to_group(std::get<0>(hx), g);
    const at::Tensor c0 = scatter_to_group(std::get<1>(hx), g, -1);
    const int64_t steps = layer_input.size(0);

    std::vector<at::Tensor> h_n_local, h_n_full, c_n_local, output;
    for (int64_t layer = 0; layer < layers; ++layer) {
      const bool last = layer == layers - 1;
      std::vector<at::Tensor> next_input, out_parts;
      for (int64_t dir = 0; dir < dirs; ++dir) {
        const auto w = lstm.layer_weights(layer, dir);
        const at::Tensor b_ih = o.bias() ? w[2] : at::Tensor(), b_hh = o.bias() ? w[3] : at::Tensor();
        // As ATen on CPU: the input projection for every step at once.
        const at::Tensor xi = at::linear(layer_input, w[0], b_ih);
        at::Tensor h_full = h0[layer * dirs + dir];
        at::Tensor c = c0[layer * dirs + dir];
        std::vector<at::Tensor> h_local_seq(steps), h_full_seq(steps);
        for (int64_t i = 0; i < steps; ++i) {
          const int64_t t = dir == 0 ? i : steps - 1 - i;
          const auto gates = at::linear(h_full, w[1], b_hh) + xi[t];
          const auto chunks = gates.chunk(kGates, 1);
          const auto in_gate = chunks[0].sigmoid(), forget_gate = chunks[1].sigmoid();
          const auto cell_gate = chunks[2].tanh(), out_gate = chunks[3].sigmoid();
          c = forget_gate * c + in_gate * cell_gate;
          const at::Tensor h = out_gate * c.tanh();
          h_full = all_gather_from_group(h, g, -1);
          h_local_seq[t] = h;
          h_full_seq[t] = h_full;
        }
        const int64_t final_step = dir == 0 ? steps - 1 : 0;
        h_n_local.push_back(h_local_seq[final_step]);
        h_n_full.push_back(h_full_seq[final_step]);
        c_n_local.push_back(c);
        if (last) {
          at::Tensor gathered;
          {
            at::NoGradGuard no_grad;
            gathered = at::stack(h_full_seq, 0);
          }
          out_parts.push_back(as_gathered(at::stack(h_local_seq, 0), gathered, g));
        } else {
          next_input.push_back(at::stack(h_full_seq, 0));
        }
      }
      if (last) {
        output = out_parts;
      } else {
        layer_input = dirs == 1 ? next_input[0] : at::cat(next_input, -1);
        // The layer output is whole on every rank: the tracker's replicated
        // stream draws the same mask everywhere.
        if (dropout) layer_input = shardplan::dropout(layer_input, o.dropout(), /*training=*/true);
      }
    }
    at::Tensor out = dirs == 1 ? output[0] : at::cat(output, -1);
    if (o.batch_first()) out = out.transpose(0, 1);
    at::Tensor gathered_h;
    {
      at::NoGradGuard no_grad;
      gathered_h = at::stack(h_n_full, 0);
    }
    at::Tensor h_n = as_gathered(at::stack(h_n_local, 0), gathered_h, g);
    at::Tensor c_n = gather_from_group(at::stack(c_n_local, 0), g, -1);
    return std::make_tuple(out, std::make_tuple(h_n, c_n));
  }

  std::string describe() const override {
    return "hidden-parallel over '" + group_->name() + "' (" + std::to_string(group_->size()) +
           "), gates i, f, g, o each split";
  }

 private:
  std::shared_ptr<Communicator> group_;
  std::string path_;
};

bool is_weight(const std::string& name) { return name.rfind("weight_ih_", 0) == 0 || name.rfind("weight_hh_", 0) == 0; }
bool is_bias(const std::string& name) { return name.rfind("bias_ih_", 0) == 0 || name.rfind("bias_hh_", 0) == 0; }
bool is_projection(const std::string& name) { return name.rfind("weight_hr_", 0) == 0; }

struct Decision {
  bool split = false;
  std::string axis;
  int64_t parts = 1;
};

Decision decide(const ModuleShard& shard) {
  Decision d;
  const ParamShard* first_split = nullptr;
  std::set<const Rule*> rules;
  for (const auto& p : shard.params) {
    const Layout& l = p.assignment.layout;
    if (p.assignment.rule) rules.insert(p.assignment.rule);
    if (is_weight(p.name)) {
      if (l.size() == 2 && l[1])
        fail_param(p, "the input dim of an LSTM weight cannot be split; an LSTM is sharded hidden-parallel, with "
                      "layout [axis, null] on every weight_ih_*/weight_hh_*, got " + layout_str(l));
      if (l.size() == 2 && l[0] && !first_split) first_split = &p;
    } else if (is_projection(p.name)) {
      if (std::any_of(l.begin(), l.end(), [](const auto& a) { return a.has_value(); }))
        fail_param(p, "LSTMs with proj_size > 0 cannot be sharded; leave weight_hr_* and the other weights replicated");
    }
  }
  for (const Rule* rule : rules) {
    reject_option(rule, "output", "does not apply to an LSTM: its output and (h_n, c_n) are always returned whole");
    reject_option(rule, "input", "does not apply to an LSTM: its input is always whole");
    reject_option(rule, "overlap", "applies to Linear layers (dense rules)");
    if (const RuleOption* b = rule->option("blocks"))
      if (b->value != "4")
        throw PlanError(b->loc, "option 'blocks' of an LSTM weight can only be 4 (its gates i, f, g, o, each split "
                                "already), got " + b->value);
  }
  if (!first_split) {
    for (const auto& p : shard.params)
      if (is_bias(p.name) && p.assignment.layout.size() == 1 && p.assignment.layout[0])
        fail_param(p, "the biases of an LSTM whose weights are replicated cannot be split, got " +
                          layout_str(p.assignment.layout));
    return d;
  }
  d.split = true;
  d.axis = *first_split->assignment.layout[0];
  d.parts = shard.mesh->axis_size(d.axis);
  const std::string expected = "[" + d.axis + ", null]";
  for (const auto& p : shard.params) {
    const Layout& l = p.assignment.layout;
    if (is_projection(p.name))
      fail_param(p, "LSTMs with proj_size > 0 cannot be sharded (" + first_split->assignment.path + " is split)");
    if (is_weight(p.name) && (l.size() != 2 || !l[0] || *l[0] != d.axis))
      fail_param(p, "every weight of a hidden-parallel LSTM must have layout " + expected + " like '" +
                        first_split->assignment.path + "' (each step needs all of h, so the layers and directions "
                        "are split alike), got " + layout_str(l));
    if (is_bias(p.name) && p.assignment.rule && (l.size() != 1 || !l[0] || *l[0] != d.axis))
      fail_param(p, "the biases of a hidden-parallel LSTM follow its weights: layout [" + d.axis +
                        "] (or no rule), got " + layout_str(l));
  }
  const ParamShard* hh = required_param(shard, "weight_hh_l0");
  const int64_t hidden = hh->assignment.shape[1];
  if (hidden % d.parts != 0)
    fail_param(*first_split, "hidden_size " + std::to_string(hidden) + " is not divisible by mesh axis '" + d.axis +
                                 "' of size " + std::to_string(d.parts) +
                                 " (each of the gates i, f, g, o is split by hidden unit)");
  return d;
}

class LSTMPlugin : public LayerPlugin {
 public:
  std::string name() const override { return "lstm"; }
  std::vector<std::string> module_types() const override { return {"shardplan::nn::LSTMImpl"}; }

  void check(ModuleShard& shard) const override {
    const Decision d = decide(shard);
    for (auto& p : shard.params) {
      if (!d.split) {
        p.note = "replicated";
        continue;
      }
      p.local_shape[0] /= d.parts;
      declare_split(p, 0, d.axis, 4);  // gates i, f, g, o each split
      p.note = is_weight(p.name) ? "hidden-parallel, gates i, f, g, o each split"
                                 : (rule_of(&p) ? "hidden-parallel" : "hidden-parallel, follows weights");
    }
  }

  void apply(ModuleShard& shard) const override {
    const Decision d = decide(shard);
    if (!d.split) return;
    auto* lstm = dynamic_cast<nn::LSTMImpl*>(shard.module);
    if (!lstm) throw Error("module '" + shard.path + "' of type " + shard.type + " is not a shardplan::nn::LSTM");
    auto group = shard.group(d.axis);
    const int64_t n = d.parts, r = group->rank();
    auto params = lstm->named_parameters(/*recurse=*/false);
    for (const auto& name : lstm->flat_weights_names())
      replace_parameter(*lstm, name, shard_of(params[name], 0, n, r, kGates));
    lstm->set_strategy(std::make_shared<HiddenParallel>(group, shard.path));
  }
};

}  // namespace
}  // namespace shardplan

SHARDPLAN_LAYER_PLUGIN(shardplan::LSTMPlugin, "lstm")
