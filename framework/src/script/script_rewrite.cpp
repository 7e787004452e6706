// The decided actions applied to the inlined graphs (the communication ops
// around each node, the global sizes of split parameters), and the report.
#include <ATen/ATen.h>

#include <map>
#include <regex>

#include "script_decide.h"
#include "script_internal.h"
#include "shardplan/shard.h"

namespace shardplan::script_detail {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;
namespace aten = torch::jit::aten;

namespace {

// One copy_to (or scatter_to) per value and group: q, k and v reading the
// same activation share one backward all-reduce.
struct Entries {
  std::map<std::tuple<Value*, torch::jit::Symbol, int64_t>, Value*> made;

  Value* get(Graph& g, Value* x, torch::jit::Symbol op, int64_t group, bool with_dim) {
    auto key = std::make_tuple(x, op, group);
    auto it = made.find(key);
    if (it != made.end()) return it->second;
    std::vector<torch::jit::NamedValue> args{x, group};
    if (with_dim) args.emplace_back(int64_t{-1});
    return made[key] = insert_after_def(g, x, op, args);
  }
};

// `out` replaced, for every later use, by op(out, ...).
Value* after(Graph& g, Node* n, torch::jit::Symbol op, std::vector<torch::jit::NamedValue> args) {
  torch::jit::WithInsertPoint at(n->next());
  Value* v = g.insert(op, args);
  n->output()->replaceAllUsesAfterNodeWith(v->node(), v);
  return v;
}

void column(const Action& a, int64_t group, Entries& entries) {
  Graph& g = *a.graph;
  a.node->replaceInput(0, entries.get(g, a.node->input(0), kCopyTo, group, false));
  if (a.gather) after(g, a.node, kGatherFrom, {a.node->output(), group, int64_t{-1}});
}

void row(const Action& a, int64_t group, Entries& entries) {
  Graph& g = *a.graph;
  Node* n = a.node;
  if (!a.input_sharded) n->replaceInput(0, entries.get(g, n->input(0), kScatterTo, group, true));
  Value* bias = n->input(2);
  const bool has_bias = bias->type()->kind() != c10::TypeKind::NoneType;
  if (has_bias) {
    torch::jit::WithInsertPoint at(n);
    n->replaceInput(2, g.insertNode(g.createNone())->output());
  }
  Value* reduced = after(g, n, kReduceFrom, {n->output(), group});
  if (has_bias) {
    torch::jit::WithInsertPoint at(reduced->node()->next());
    Value* sum = g.insert(aten::add, {reduced, bias});
    reduced->replaceAllUsesAfterNodeWith(sum->node(), sum);
  }
}

void vocab(const Action& a, int64_t group) {
  Graph& g = *a.graph;
  Node* n = a.node;
  const int64_t begin = shard_range(a.weight->original.size(0), a.weight->splits[0].parts, a.weight->splits[0].index).first;
  torch::jit::WithInsertPoint at(n);
  Value* y = g.insert(kVocabEmbedding, {n->input(0), n->input(1), n->input(2), begin, group});
  n->output()->replaceAllUsesWith(y);
  n->destroy();
}

// Code reading a parameter's size means the model's size (F.embedding checks
// padding_idx against it): those reads become the global size.
void global_sizes(const Param& p) {
  const auto shape = p.original.sizes().vec();
  for (const Use& u : p.uses) {
    Node* n = u.node;
    if (n->kind() != aten::size) continue;
    Graph& g = *n->owningGraph();
    torch::jit::WithInsertPoint at(n);
    Value* c = nullptr;
    if (n->inputs().size() == 1) {
      c = g.insertConstant(c10::IValue(shape));
    } else {
      auto dim = torch::jit::toIValue(n->input(1));
      if (!dim || !dim->isInt())
        throw Error("parameter '" + p.paths.front() + "': its size is read at " + where(n) +
                    " along a dim only known at run time; the rewrite can give only a constant dim its global size");
      int64_t d = dim->toInt();
      if (d < 0) d += static_cast<int64_t>(shape.size());
      c = g.insertConstant(shape.at(d));
    }
    n->output()->replaceAllUsesWith(c);
  }
}

const char* role_note(Role r) {
  switch (r) {
    case Role::Column: return "column-parallel (aten::linear)";
    case Role::ColumnBias: return "column-parallel bias, follows its weight";
    case Role::Row: return "row-parallel (aten::linear), partial products all-reduced";
    case Role::Vocab: return "vocab-parallel (aten::embedding), partial rows all-reduced";
    case Role::EmbedDim: return "embedding-dim-parallel (aten::embedding), output all-gathered";
    default: return "replicated";
  }
}

std::string type_of_owner(const torch::jit::Module& clone, const std::string& path) {
  static const std::regex mangle(R"(___torch_mangle_\d+\.)");
  const auto dot = path.rfind('.');
  torch::jit::Module m = clone;
  if (dot != std::string::npos)
    for (const auto& nm : clone.named_modules())
      if (nm.name == path.substr(0, dot)) m = nm.value;
  return std::regex_replace(m.type()->name()->qualifiedName(), mangle, "");
}

}  // namespace

void rewrite(const Decisions& d, const std::map<std::string, int64_t>& group_ids) {
  // Sizes first: vocab() destroys embedding nodes the uses still name.
  for (const Param& p : d.params)
    if (p.role != Role::Whole) global_sizes(p);
  Entries entries;
  for (const Action& a : d.actions) {
    const int64_t group = group_ids.at(a.axis);
    if (a.role == Role::Column) column(a, group, entries);
    if (a.role == Role::Row) row(a, group, entries);
    if (a.role == Role::EmbedDim) after(*a.graph, a.node, kGatherFrom, {a.node->output(), group, int64_t{-1}});
  }
  for (const Action& a : d.actions)
    if (a.role == Role::Vocab) vocab(a, group_ids.at(a.axis));
}

void fill_report(ParallelReport& report, const torch::jit::Module& clone, const Decisions& d) {
  for (const auto& np : clone.named_parameters()) {
    const Param& p = d.params[d.by_path.at(np.name)];
    size_t i = 0;
    while (p.paths[i] != np.name) ++i;
    const Assignment& a = *p.assignments[i];
    ReportRow row;
    row.path = row.plan_path = np.name;
    row.module_type = type_of_owner(clone, np.name);
    row.rule = a.rule ? a.rule->loc.str() : "";
    Layout layout = a.layout;
    if (!a.rule && p.role == Role::ColumnBias) layout = {p.axis};
    row.layout = layout_str(layout);
    row.plugin = p.role == Role::Whole ? "" : "script";
    row.note = role_note(p.role);
    row.global_shape = p.original.sizes().vec();
    row.local_shape = np.value.sizes().vec();
    row.element_size = static_cast<int64_t>(np.value.element_size());
    row.tied_to = i == 0 ? "" : p.paths.front();
    row.splits = p.splits;
    report.rows.push_back(std::move(row));
  }
}

}  // namespace shardplan::script_detail
