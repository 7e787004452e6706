// The decided actions applied to the inlined graphs (each through its
// rewrite, with the communication edits of ScriptGraphEdit; the global sizes
// of split parameters), and the report.
#include <ATen/ATen.h>

#include <map>

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
using Made = std::map<std::tuple<Value*, torch::jit::Symbol, int64_t>, Value*>;

// `v` replaced, for every use after the new node, by op(v, ...).
Value* after(Graph& g, Value* v, torch::jit::Symbol op, std::vector<torch::jit::NamedValue> args) {
  torch::jit::WithInsertPoint at(v->node()->next());
  Value* out = g.insert(op, args);
  v->replaceAllUsesAfterNodeWith(out->node(), out);
  return out;
}

class Edit : public ScriptGraphEdit {
 public:
  Edit(const Action& a, int64_t group, int64_t parts, int64_t index, Made& made, std::vector<ShardedOutput>& sharded)
      : g_(*a.read.node->owningGraph()), a_(a), group_(group), parts_(parts), index_(index), made_(made),
        sharded_(sharded) {}
  Graph& graph() override { return g_; }
  Value* copy_to(Value* x) override { return once(x, kCopyTo, {x, group_}); }
  Value* scatter_to(Value* x, int64_t dim) override { return once(x, kScatterTo, {x, group_, dim}); }
  Value* reduce_after(Value* v) override { return after(g_, v, kReduceFrom, {v, group_}); }
  Value* gather_after(Value* v, int64_t dim) override { return after(g_, v, kGatherFrom, {v, group_, dim}); }
  void output_sharded(Value* v) override { sharded_.push_back({v, &a_, group_}); }
  int64_t group() const override { return group_; }
  int64_t parts() const override { return parts_; }
  int64_t index() const override { return index_; }

 private:
  Value* once(Value* x, torch::jit::Symbol op, std::vector<torch::jit::NamedValue> args) {
    auto key = std::make_tuple(x, op, group_);
    auto it = made_.find(key);
    if (it != made_.end()) return it->second;
    return made_[key] = insert_after_def(g_, x, op, std::move(args));
  }
  Graph& g_;
  const Action& a_;
  int64_t group_, parts_, index_;
  Made& made_;
  std::vector<ShardedOutput>& sharded_;
};

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

// Every module's type name by path ("" the root), made once per report: a
// walk of named_modules() per parameter made the report quadratic (about 1 s
// of parallelize_script for 1000 parameters, benchmarks/script).
std::map<std::string, std::string> module_types(const torch::jit::Module& clone) {
  std::map<std::string, std::string> out;
  for (const auto& nm : clone.named_modules())
    out.emplace(nm.name, script_detail::unmangled_type_name(nm.value.type()->name()->qualifiedName()));
  return out;
}

std::string owner_of(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

}  // namespace

void rewrite(Decisions& d, const std::map<std::string, int64_t>& group_ids, const Mesh& mesh, int rank) {
  // Sizes first: a rewrite may destroy the nodes the uses still name.
  for (const Param& p : d.params)
    if (p.split) global_sizes(p);
  Made made;
  std::vector<ShardedOutput> sharded;
  for (bool destroying : {false, true})
    for (const Action& a : d.actions) {
      if (a.rewrite->destroys_node != destroying) continue;
      const std::string& axis = a.param->axis;
      Edit edit(a, group_ids.at(axis), mesh.axis_size(axis), mesh.coord(rank, axis), made, sharded);
      a.rewrite->apply(a.read, a.cut, edit);
    }
  // After every edit: the reductions and gathers inserted are where a
  // sharded output stops being one.
  for (const auto& [param, note] : vocab_parallel_losses(sharded)) d.params[param - d.params.data()].note += note;
}

void fill_report(ParallelReport& report, const torch::jit::Module& clone, const Decisions& d) {
  const std::map<std::string, std::string> types = module_types(clone);
  for (const auto& np : clone.named_parameters()) {
    const Param& p = d.params[d.by_path.at(np.name)];
    size_t i = 0;
    while (p.paths[i] != np.name) ++i;
    const Assignment& a = *p.assignments[i];
    ReportRow row;
    row.path = row.plan_path = np.name;
    row.module_type = types.at(owner_of(np.name));
    row.rule = a.rule ? a.rule->loc.str() : "";
    Layout layout = a.layout;
    if (!a.rule && p.split) {
      layout.assign(p.original.dim(), std::nullopt);
      layout[p.dim] = p.axis;
    }
    row.layout = layout_str(layout);
    row.plugin = p.split ? "script" : "";
    row.note = p.split ? p.note : "replicated";
    row.global_shape = p.original.sizes().vec();
    row.local_shape = np.value.sizes().vec();
    row.element_size = static_cast<int64_t>(np.value.element_size());
    row.tied_to = i == 0 ? "" : p.paths.front();
    row.splits = p.splits;
    report.rows.push_back(std::move(row));
  }
}

}  // namespace shardplan::script_detail
