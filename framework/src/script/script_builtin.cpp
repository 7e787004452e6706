// The built-in rewrites: column- and row-parallel aten::linear (Megatron's
// pair), vocab- and embedding-dim-parallel aten::embedding. They use the
// registry's interface only, as a user's rewrite would.
#include <ATen/ATen.h>

#include "script_internal.h"
#include "shardplan/error.h"
#include "shardplan/plugin_support.h"
#include "shardplan/shard.h"

namespace shardplan::script_detail {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;
namespace aten = torch::jit::aten;

bool rows_split(const Layout& l, const std::string& op) {
  if (l.size() != 2 || (l[0] && l[1]) || (!l[0] && !l[1]))
    throw Error("layout " + layout_str(l) + " is not one the TorchScript rewrite supports for a weight of " + op +
                " ([axis, null] or [null, axis])");
  return l[0].has_value();
}

void add_after(Graph& g, Value* reduced, Value* bias) {
  torch::jit::WithInsertPoint at(reduced->node()->next());
  Value* sum = g.insert(aten::add, {reduced, bias});
  reduced->replaceAllUsesAfterNodeWith(sum->node(), sum);
}

namespace {

int64_t option_blocks(const Rule* rule) { return rule ? std::stoll(rule->option_or("blocks", "1")) : 1; }

ScriptCut linear_decide(const ScriptRead& r) {
  ScriptCut cut;
  if (rows_split(r.layout, "aten::linear")) {
    reject_option(r.rule, "input", "applies to a row-parallel linear (weight [null, axis]); this one is column-parallel");
    const bool gathered = output_option_gathered(r.rule);
    cut.blocks = option_blocks(r.rule);
    cut.note = std::string("column-parallel (aten::linear)") + (gathered ? "" : ", output sharded");
    cut.followers.push_back({r.node, 2, 0});
  } else {
    reject_option(r.rule, "output", "applies to a column-parallel linear (weight [axis, null]); this one is row-parallel");
    reject_option(r.rule, "blocks", "applies to column-parallel layers only");
    input_option_sharded(r.rule);
    cut.dim = 1;
    cut.note = "row-parallel (aten::linear), partial products all-reduced";
    cut.whole.push_back(
        {r.node, 2, "the bias of a row-parallel linear is added after the reduction and must be replicated ([null])"});
  }
  return cut;
}

void linear_apply(const ScriptRead& r, const ScriptCut& cut, ScriptGraphEdit& e) {
  Node* n = r.node;
  if (cut.dim == 0) {
    n->replaceInput(0, e.copy_to(n->input(0)));
    if (output_option_gathered(r.rule))
      e.gather_after(n->output(), -1);
    else
      e.output_sharded(n->output());
    return;
  }
  if (!input_option_sharded(r.rule)) n->replaceInput(0, e.scatter_to(n->input(0), -1));
  Value* bias = n->input(2);
  const bool has_bias = bias->type()->kind() != c10::TypeKind::NoneType;
  if (has_bias) {
    torch::jit::WithInsertPoint at(n);
    n->replaceInput(2, e.graph().insertNode(e.graph().createNone())->output());
  }
  Value* reduced = e.reduce_after(n->output());
  if (has_bias) add_after(e.graph(), reduced, bias);
}

bool constant_false(Value* v) {
  auto iv = torch::jit::toIValue(v);
  return iv && iv->isBool() && !iv->toBool();
}

ScriptCut embedding_decide(const ScriptRead& r) {
  ScriptCut cut;
  const bool vocab = rows_split(r.layout, "aten::embedding");
  for (size_t i : {3, 4})
    if (!constant_false(r.node->input(i)))
      throw Error("a split embedding needs scale_grad_by_freq and sparse to be False");
  cut.dim = vocab ? 0 : 1;
  cut.uneven = vocab;
  cut.note = vocab ? "vocab-parallel (aten::embedding), partial rows all-reduced"
                   : "embedding-dim-parallel (aten::embedding), output all-gathered";
  return cut;
}

// Megatron's VocabParallelEmbedding (script_ops.cpp's vocab_embedding) in
// place of the node.
void embedding_apply(const ScriptRead& r, const ScriptCut& cut, ScriptGraphEdit& e) {
  Node* n = r.node;
  if (cut.dim == 1) {
    e.gather_after(n->output(), -1);
    return;
  }
  const int64_t begin = shard_range(r.shape[0], e.parts(), e.index()).first;
  torch::jit::WithInsertPoint at(n);
  Value* y = e.graph().insert(kVocabEmbedding, {n->input(0), n->input(1), n->input(2), begin, e.group()});
  n->output()->replaceAllUsesWith(y);
  n->destroy();
}

}  // namespace

RewriteList builtin_rewrites() {
  RewriteList out;
  out.push_back({{"aten::linear", 1}, ScriptRewrite{"linear", linear_decide, linear_apply, false}});
  out.push_back({{"aten::embedding", 0}, ScriptRewrite{"embedding", embedding_decide, embedding_apply, true}});
  for (auto& m : matmul_rewrites()) out.push_back(std::move(m));
  return out;
}

}  // namespace shardplan::script_detail
