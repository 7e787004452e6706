// Linears written out: `x @ W.t() (+ b)` and `torch.addmm(b, x, W.t())`.
// The planned weight feeds aten::t, so that is the registry key; the rewrite
// looks through it to the product, which it cuts like aten::linear's.
#include <ATen/ATen.h>

#include <optional>

#include "script_internal.h"
#include "shardplan/error.h"
#include "shardplan/plugin_support.h"

namespace shardplan::script_detail {

using torch::jit::Node;
using torch::jit::Value;
namespace aten = torch::jit::aten;

namespace {

// The product W.t() feeds, and which input of it is the activation.
std::pair<Node*, size_t> product_of(const ScriptRead& r) {
  const auto& uses = r.node->output()->uses();
  if (uses.size() == 1) {
    const auto& u = uses.front();
    if (u.user->kind() == aten::matmul && u.offset == 1) return {u.user, 0};
    if (u.user->kind() == aten::addmm && u.offset == 2) return {u.user, 1};
  }
  std::string users;
  for (const auto& u : uses) users += (users.empty() ? "" : ", ") + std::string(u.user->kind().toQualString());
  throw Error("W.t() feeds " + (users.empty() ? std::string("nothing") : users) +
              "; the matmul rewrite takes it only as the one right operand of aten::matmul (x @ W.t()) or the mat2 "
              "of aten::addmm (torch.addmm(b, x, W.t()))");
}

// `y + b` (or `b + y`) right after the product: the add and b's input.
std::optional<std::pair<Node*, size_t>> bias_add(Node* product) {
  const auto& uses = product->output()->uses();
  if (uses.size() != 1 || uses.front().user->kind() != aten::add || uses.front().offset > 1) return std::nullopt;
  return std::make_pair(uses.front().user, size_t{1} - uses.front().offset);
}

// The product's value left sharded: the `+ b` right after a matmul, whose
// bias is cut with W, when there is one.
Value* sharded_sum(Node* product) {
  auto add = bias_add(product);
  return product->kind() == aten::matmul && add ? add->first->output() : product->output();
}

bool is_one(Value* v) {
  auto iv = torch::jit::toIValue(v);
  return iv && ((iv->isInt() && iv->toInt() == 1) || (iv->isDouble() && iv->toDouble() == 1.0));
}

ScriptCut t_decide(const ScriptRead& r) {
  Node* product = product_of(r).first;
  const std::string op = product->kind().toQualString();
  ScriptCut cut;
  // W is [out, in]: its rows are the product's output features.
  if (rows_split(r.layout, "W.t() in " + op)) {
    reject_option(r.rule, "input", "applies to a row-parallel product (weight [null, axis]); this one is column-parallel");
    const bool gathered = output_option_gathered(r.rule);
    cut.blocks = r.rule ? std::stoll(r.rule->option_or("blocks", "1")) : 1;
    cut.note = "column-parallel (" + op + " of W.t())" + (gathered ? "" : ", output sharded");
    if (product->kind() == aten::addmm) {
      cut.followers.push_back({product, 0, 0});
    } else if (auto add = bias_add(product); add && !gathered) {
      cut.followers.push_back({add->first, add->second, 0});
    }
  } else {
    reject_option(r.rule, "output", "applies to a column-parallel product (weight [axis, null]); this one is row-parallel");
    reject_option(r.rule, "blocks", "applies to column-parallel layers only");
    input_option_sharded(r.rule);
    cut.dim = 1;
    cut.note = "row-parallel (" + op + " of W.t()), partial products all-reduced";
    if (product->kind() == aten::addmm) {
      if (!is_one(product->input(3)) || !is_one(product->input(4)))
        throw Error("a row-parallel aten::addmm needs beta and alpha of 1 (the bias is added after the reduction)");
      cut.whole.push_back({product, 0, "the bias of a row-parallel aten::addmm is added after the reduction and must "
                                       "be replicated ([null])"});
    }
  }
  return cut;
}

void t_apply(const ScriptRead& r, const ScriptCut& cut, ScriptGraphEdit& e) {
  auto [product, x] = product_of(r);
  auto& g = e.graph();
  if (cut.dim == 0) {
    product->replaceInput(x, e.copy_to(product->input(x)));
    if (output_option_gathered(r.rule))
      e.gather_after(product->output(), -1);
    else
      e.output_sharded(sharded_sum(product));
    return;
  }
  if (!input_option_sharded(r.rule)) product->replaceInput(x, e.scatter_to(product->input(x), -1));
  if (product->kind() == aten::matmul) {
    e.reduce_after(product->output());  // a `+ b` after it now adds to the sum
    return;
  }
  // addmm(b, x, W.t()) = mm(x, W.t()) + b, with the sum taken between.
  Value* mm = nullptr;
  {
    torch::jit::WithInsertPoint at(product);
    mm = g.insert(aten::mm, {product->input(1), product->input(2)});
  }
  Value* bias = product->input(0);
  product->output()->replaceAllUsesWith(mm);
  product->destroy();
  add_after(g, e.reduce_after(mm), bias);
}

}  // namespace

RewriteList matmul_rewrites() {
  return {{{"aten::t", 0}, ScriptRewrite{"matmul", t_decide, t_apply, true}}};
}

}  // namespace shardplan::script_detail
