// Reading and editing the inlined graph of a TorchScript method.
#include <torch/csrc/jit/passes/inliner.h>

#include <cstdint>

#include "script_internal.h"
#include "shardplan/error.h"

namespace shardplan::script_detail {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;

std::vector<Node*> all_nodes(Block* b) {
  std::vector<Node*> out;
  for (Node* n : b->nodes()) {
    out.push_back(n);
    for (Block* sub : n->blocks()) {
      auto inner = all_nodes(sub);
      out.insert(out.end(), inner.begin(), inner.end());
    }
  }
  return out;
}

std::string where(const Node* n) {
  // A loaded module's ranges point into its serialized code; the range that
  // generated it is the user's Python line.
  torch::jit::SourceRange range = n->sourceRange();
  if (auto original = range.findSourceRangeThatGenerated()) range = *original;
  auto flc = range.file_line_col();
  if (!flc) return "<unknown source>";
  return std::get<0>(*flc) + ":" + std::to_string(std::get<1>(*flc)) + ":" + std::to_string(std::get<2>(*flc));
}

std::optional<std::string> traced_at(torch::jit::Graph& g) {
  // The tracer keeps each op's Python line but not its column (file:line:0);
  // the compiler keeps the column of every expression, which inside a
  // method's indented body is never 0.
  for (Node* n : all_nodes(g.block())) {
    torch::jit::SourceRange range = n->sourceRange();
    if (auto original = range.findSourceRangeThatGenerated()) range = *original;
    auto flc = range.file_line_col();
    if (flc && !std::get<0>(*flc).empty() && std::get<2>(*flc) == 0)
      return std::get<0>(*flc) + ":" + std::to_string(std::get<1>(*flc));
  }
  return std::nullopt;
}

void inline_calls(torch::jit::Graph& g, const std::string& name) {
  // Inline() takes each callee's optimized graph, itself inlined only while
  // the graph executor optimizes: with that off one pass inlines one level.
  size_t before = SIZE_MAX;
  for (;;) {
    torch::jit::Inline(g);
    std::vector<Node*> calls;
    for (Node* n : all_nodes(g.block()))
      if (n->kind() == torch::jit::prim::CallMethod || n->kind() == torch::jit::prim::CallFunction) calls.push_back(n);
    if (calls.empty()) return;
    if (calls.size() < before) {
      before = calls.size();
      continue;
    }
    Node* call = calls.front();
    const std::string what = call->kind() == torch::jit::prim::CallMethod
                                 ? "method '" + call->s(torch::jit::attr::name) + "'"
                                 : std::string("a function value");
    throw Error("cannot shard method '" + name + "': its call of " + what + " at " + where(call) +
                " cannot be inlined (an interface method or a function passed as a value), so the parameters "
                "it reads cannot be rewritten");
  }
}

std::shared_ptr<torch::jit::Graph> inlined_graph(torch::jit::Module& m, const std::string& name) {
  auto method = m.find_method(name);
  if (!method) throw Error("TorchScript module has no method '" + name + "' to shard");
  std::shared_ptr<torch::jit::Graph> g = method->graph();
  inline_calls(*g, name);
  return g;
}

std::optional<std::string> attr_path(Value* v, Value* self) {
  if (v == self) return std::string();
  Node* n = v->node();
  if (n->kind() != torch::jit::prim::GetAttr) return std::nullopt;
  auto base = attr_path(n->input(0), self);
  if (!base) return std::nullopt;
  const std::string& name = n->s(torch::jit::attr::name);
  return base->empty() ? name : *base + "." + name;
}

Value* insert_after_def(torch::jit::Graph& g, Value* x, torch::jit::Symbol op, std::vector<torch::jit::NamedValue> args) {
  // A block input's node is the block's param node, whose next() is the
  // block's first node: before it is the block's start.
  torch::jit::WithInsertPoint at(x->node()->next());
  return g.insert(op, args);
}

}  // namespace shardplan::script_detail
