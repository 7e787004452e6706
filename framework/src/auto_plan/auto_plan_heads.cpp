// Attention from separate Linears (Llama's q_proj, k_proj, v_proj into
// o_proj), or from one Linear stacking q, k and v (GPT-2's c_attn, cut in 3
// blocks): found in the probe's graph and split by heads.
//
// Unlike shardplan::nn::MultiheadAttention, such attention is the model's
// own code, so nothing says where its heads are. Three things from the
// probe do:
//   - the walk back from o's input reaches several Linears' outputs through
//     what attention does (views, transposes, batched products, softmax,
//     rotary tables and masks as constants), with a softmax and a product
//     among them, and nothing else reads the activations on the way;
//   - the head size is the last dim of the view that merges the heads'
//     context [.., heads, head_dim] into o's input;
//   - the heads stay apart at the planned rank count: for each rank, a
//     vector-Jacobian product from that rank's share of o's input (its query
//     heads' context) is zero on every projection's features outside that
//     rank's heads. This is the property a head split needs, measured rather
//     than assumed, so a model that mixes heads (or maps query heads to kv
//     heads in another order) stays replicated, with the reason.
// What cannot be seen: whether the model takes its head counts from what its
// projections return (as examples/models/llama.cpp does); one that hard-codes
// them fails at its first sharded forward with a shape error.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/generated/Functions.h>

#include <algorithm>
#include <utility>

#include "auto_plan_probe.h"
#include "shardplan/nn/linear.h"

namespace shardplan {
namespace auto_detail {
namespace {

using torch::autograd::Node;
namespace gen = torch::autograd::generated;

std::string num(int64_t v) { return std::to_string(v); }

// The forward input's sizes of a view/reshape node, or empty.
std::vector<int64_t> viewed_from(Node* n) {
  const std::vector<c10::SymInt>* sizes = nullptr;
  if (auto* v = dynamic_cast<gen::ViewBackward0*>(n)) sizes = &v->self_sym_sizes;
  if (auto* u = dynamic_cast<gen::UnsafeViewBackward0*>(n)) sizes = &u->self_sym_sizes;
  if (auto* r = dynamic_cast<gen::ReshapeAliasBackward0*>(n)) sizes = &r->self_sym_sizes;
  std::vector<int64_t> out;
  if (sizes)
    for (const auto& s : *sizes) out.push_back(s.expect_int());
  return out;
}

// head_dim from the view that makes o's input [.., H*D] out of [.., H, D],
// past elementwise operations after it (dropout on the context); 0 if none.
int64_t merged_head_dim(const Layer& o) {
  const int64_t features = o.input.size(-1);
  Node* n = o.input.grad_fn().get();
  for (int step = 0; n && step < 8; ++step) {
    const std::vector<int64_t> from = viewed_from(n);
    if (!from.empty()) {
      const size_t k = from.size();
      const bool merges = k == static_cast<size_t>(o.input.dim()) + 1 && from[k - 2] * from[k - 1] == features;
      return merges ? from[k - 1] : 0;
    }
    if (!is_elementwise_unary(n->name()) || n->next_edges().empty()) return 0;
    n = n->next_edges()[0].function.get();
  }
  return 0;
}

// The features of projection i (of each of its blocks) that rank r computes
// with: its heads' share, or the one head it replicates.
std::pair<int64_t, int64_t> share(const HeadSplit& s, size_t i, int r, int ranks) {
  const int64_t heads = s.projections[i]->width / s.blocks / s.head_dim;
  if (s.replicate[i]) return {r * heads / ranks * s.head_dim, s.head_dim};
  const int64_t per = heads / ranks * s.head_dim;
  return {r * per, per};
}

// "" when each rank's share of o's input depends on its own features of
// every projection only; else which rank reads what.
std::string heads_stay_apart(const Layer& o, const HeadSplit& s, int ranks) {
  const at::Tensor& ctx = o.input;
  std::vector<at::Tensor> outs;
  for (Layer* p : s.projections) outs.push_back(p->output);
  auto rng = at::make_generator<at::CPUGeneratorImpl>(20);
  const int64_t per = s.heads / ranks * s.head_dim;
  for (int r = 0; r < ranks; ++r) {
    // Random, not ones: a softmax's rows sum to one, so a constant
    // cotangent would hide what the scores depend on.
    at::Tensor cot = at::zeros(ctx.sizes(), ctx.options().device(at::kCPU));
    cot.narrow(-1, r * per, per).normal_(0, 1, rng);
    std::vector<at::Tensor> grads;
    try {
      grads = torch::autograd::grad({ctx}, outs, {cot.to(ctx.device())}, /*retain_graph=*/true,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    } catch (const std::exception& e) {
      std::string what = e.what();
      return "its graph could not be differentiated to see whether heads stay apart (did the probe run backward?): " +
             what.substr(0, what.find('\n'));
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!grads[i].defined()) continue;
      const auto [lo, len] = share(s, i, r, ranks);
      at::Tensor outside = grads[i].clone();
      const int64_t block = s.projections[i]->width / s.blocks;
      for (int64_t b = 0; b < s.blocks; ++b) outside.narrow(-1, b * block + lo, len).zero_();
      if (outside.count_nonzero().item<int64_t>() > 0)
        return "the heads do not stay apart at " + num(ranks) + " ranks: the context of rank " + num(r) +
               "'s query heads reads " + s.projections[i]->name() + "'s outputs outside features " + num(lo) + ".." +
               num(lo + len - 1);
    }
  }
  return "";
}

// Head counts at `ranks`: s.replicate filled, or why they do not split.
std::string divide_heads(HeadSplit& s, int ranks) {
  const int64_t d = s.head_dim;
  for (Layer* p : s.projections) {
    const int64_t width = p->width / s.blocks;
    if (width % d != 0) return p->name() + "'s " + num(width) + " outputs are not whole heads of " + num(d);
    if (s.heads % (width / d) != 0)
      return p->name() + "'s " + num(width / d) + " heads do not divide the " + num(s.heads) + " query heads";
  }
  if (s.heads % ranks != 0)
    return num(s.heads) + " query heads of " + num(d) + " do not divide among " + num(ranks) + " ranks";
  for (Layer* p : s.projections) {
    const int64_t h = p->width / s.blocks / d;
    if (s.blocks > 1 && h % ranks != 0)
      return p->name() + "'s " + num(h) + " heads of " + num(d) + " per block do not divide among " + num(ranks) +
             " ranks";
    if (h % ranks != 0 && ranks % h != 0)
      return p->name() + "'s " + num(h) + " heads of " + num(d) + " neither divide among " + num(ranks) +
             " ranks nor the ranks among them";
    s.replicate.push_back(h % ranks != 0);
  }
  return "";
}

// "" when every Linear that declares its head size (nn::Linear's
// out_head_dim, o's in_head_dim) declares the probe's; else which does not:
// the written head_dim would be refused at its rule.
std::string declared_heads_agree(const HeadSplit& s, const Layer& o) {
  auto said = [&](const Layer& l, bool in) -> std::string {
    const auto* linear = dynamic_cast<const nn::LinearImpl*>(l.module);
    const int64_t d = !linear ? 0 : in ? linear->in_head_dim : linear->out_head_dim;
    if (d == 0 || d == s.head_dim) return "";
    return "the model says " + l.name() + "'s heads are of " + num(d) + ", but its context is reshaped from heads of " +
           num(s.head_dim);
  };
  for (const Layer* p : s.projections)
    if (std::string why = said(*p, false); !why.empty()) return why;
  return said(o, true);
}

}  // namespace

HeadSplit split_heads(ProbeGraph& graph, const Layer& o, int ranks) {
  HeadSplit s;
  if (o.kind != Kind::Linear || o.inside_attention || o.calls != 1) return s;
  const Feed f = graph.feed(o, Kind::Linear, is_attention_op, /*constants=*/true);
  auto has = [&](const char* op) { return std::find(f.ops.begin(), f.ops.end(), op) != f.ops.end(); };
  if (!has("softmax") || !(has("bmm") || has("mm"))) return s;
  s.attention = true;
  s.projections = f.producers;
  // The walk meets them in graph order; rules and reasons follow the probe's.
  std::sort(s.projections.begin(), s.projections.end(), [](const Layer* a, const Layer* b) {
    return a->output.grad_fn()->sequence_nr() < b->output.grad_fn()->sequence_nr();
  });
  if (!f.why_not.empty()) {
    s.why_not = f.why_not;
    s.projections = f.held_back;
    return s;
  }
  if (s.projections.empty()) {
    s.attention = false;
    return s;
  }
  // One Linear giving q, k and v stacked, each as wide as o's input (GPT-2's
  // c_attn): three blocks, each split by heads. Whether the stacking is
  // q, k, v in thirds is what heads_stay_apart measures.
  if (s.projections.size() < 2 && s.projections[0]->width != 3 * o.input.size(-1)) {
    s.why_not = "q, k and v come from one Linear (" + s.projections[0]->name() + ") whose " +
                num(s.projections[0]->width) + " outputs are not 3 blocks of o's " + num(o.input.size(-1)) +
                " inputs (a written plan's blocks: says how it stacks them)";
    return s;
  }
  if (s.projections.size() < 2) s.blocks = 3;
  s.head_dim = merged_head_dim(o);
  if (s.head_dim < 1) {
    s.why_not = "the head size is unknown: its input is not reshaped from [.., heads, head_dim]";
    return s;
  }
  s.heads = o.input.size(-1) / s.head_dim;
  s.why_not = declared_heads_agree(s, o);
  if (s.why_not.empty()) s.why_not = divide_heads(s, ranks);
  if (s.why_not.empty() && ranks > 1) s.why_not = heads_stay_apart(o, s, ranks);
  return s;
}

}  // namespace auto_detail
}  // namespace shardplan
