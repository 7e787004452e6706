// What a plan makes of a TorchScript module: each planned parameter's role
// follows from its layout and the op that reads it (a linear's weight split
// by rows is column-parallel, an embedding's is vocab-parallel), and every
// read of it must be one the rewrite understands, or the module would run
// with a shard where it expects the whole tensor.
#include "script_decide.h"

#include "script_internal.h"
#include "shardplan/error.h"
#include "shardplan/plugin_support.h"
#include "shardplan/shard.h"

namespace shardplan::script_detail {

using torch::jit::Node;
namespace aten = torch::jit::aten;

namespace {

bool planned(const Param& p) {
  for (const Assignment* a : p.assignments)
    for (const auto& dim : a->layout)
      if (dim) return true;
  return false;
}

std::string rule_at(const Param& p) {
  for (const Assignment* a : p.assignments)
    if (a->rule) return " (rule " + a->rule->loc.str() + ")";
  return " (no rule: it follows the weight it is the bias of)";
}

[[noreturn]] void fail(const Param& p, const std::string& what) {
  for (const Assignment* a : p.assignments)
    if (a->rule) throw PlanError(a->rule->loc, "parameter '" + p.paths.front() + "': " + what);
  throw Error("parameter '" + p.paths.front() + "': " + what);
}

const Assignment& assignment_of(const Param& p, const std::string& path) {
  for (size_t i = 0; i < p.paths.size(); ++i)
    if (p.paths[i] == path) return *p.assignments[i];
  return *p.assignments.front();
}

void collect_uses(Decisions& d, const std::vector<std::shared_ptr<torch::jit::Graph>>& graphs) {
  for (const auto& g : graphs) {
    torch::jit::Value* self = g->inputs()[0];
    for (Node* n : all_nodes(g->block())) {
      if (n->kind() != torch::jit::prim::GetAttr) continue;
      auto path = attr_path(n->output(), self);
      auto it = path ? d.by_path.find(*path) : d.by_path.end();
      if (it == d.by_path.end()) continue;
      for (const auto& u : n->output()->uses()) d.params[it->second].uses.push_back({u.user, u.offset, *path});
    }
  }
}

// Tied paths hold one tensor, so they must be cut one way.
void check_tied(const Param& p) {
  for (size_t i = 1; i < p.paths.size(); ++i)
    if (p.assignments[i]->layout != p.assignments[0]->layout)
      fail(p, "is tied to '" + p.paths[i] + "' (one tensor), but the plan gives them different layouts " +
                  layout_str(p.assignments[0]->layout) + " and " + layout_str(p.assignments[i]->layout) +
                  "; plan tied parameters alike");
}

// The role a planned weight's layout and readers give it.
void weight_role(Param& p) {
  const Layout& l = p.assignments.front()->layout;
  for (const Use& u : p.uses) {
    const bool linear = u.node->kind() == aten::linear && u.input == 1;
    const bool embedding = u.node->kind() == aten::embedding && u.input == 0;
    if (!linear && !embedding) continue;
    if (l.size() != 2 || (l[0] && l[1]))
      fail(p, "layout " + layout_str(l) + " is not one the TorchScript rewrite supports for a weight of " +
                  u.node->kind().toQualString() + " ([axis, null] or [null, axis])");
    Role r = l[0] ? (linear ? Role::Column : Role::Vocab) : (linear ? Role::Row : Role::EmbedDim);
    // A tied embedding and head both split by vocabulary rows: one cut.
    const bool compatible = p.role == Role::Whole || p.role == r ||
                            (p.role == Role::Column && r == Role::Vocab) || (p.role == Role::Vocab && r == Role::Column);
    if (!compatible)
      fail(p, std::string("is read as a weight by ops that need it cut two ways (") + u.node->kind().toQualString() + " at " +
                  where(u.node) + " is one); this layout cannot serve both");
    if (p.role != Role::Column) p.role = r;
    p.axis = *(l[0] ? l[0] : l[1]);
  }
}

bool constant_false(torch::jit::Value* v) {
  auto iv = torch::jit::toIValue(v);
  return iv && iv->isBool() && !iv->toBool();
}

int64_t option_blocks(const Rule* rule) { return rule ? std::stoll(rule->option_or("blocks", "1")) : 1; }

void linear_action(Decisions& d, torch::jit::Graph* g, Node* n, Param& w, const std::string& wpath, Param* b) {
  const Rule* rule = assignment_of(w, wpath).rule;
  Action a{g, n, w.role == Role::Vocab ? Role::Column : w.role, &w, b, false, false, w.axis};
  if (a.role == Role::Column) {
    reject_option(rule, "input", "applies to a row-parallel linear (weight [null, axis]); this one is column-parallel");
    a.gather = output_option_gathered(rule);
    w.blocks = option_blocks(rule);
    if (b) {
      for (const Assignment* ba : b->assignments)
        if (ba->rule && (ba->layout.size() != 1 || ba->layout[0] != w.axis))
          fail(*b, "the bias of a column-parallel linear must follow its weight: layout [" + w.axis + "], got " +
                       layout_str(ba->layout));
      b->role = Role::ColumnBias;
      b->axis = w.axis;
      b->blocks = w.blocks;
    }
  } else {
    reject_option(rule, "output", "applies to a column-parallel linear (weight [axis, null]); this one is row-parallel");
    reject_option(rule, "blocks", "applies to column-parallel layers only");
    a.input_sharded = input_option_sharded(rule);
    if (b && planned(*b))
      fail(*b, "the bias of a row-parallel linear is added after the reduction and must be replicated ([null])");
  }
  d.actions.push_back(a);
}

void node_actions(Decisions& d, const std::vector<std::shared_ptr<torch::jit::Graph>>& graphs) {
  for (auto& p : d.params)
    for (const Use& u : p.uses) {
      if (p.role == Role::Whole || p.role == Role::ColumnBias) continue;
      auto* g = u.node->owningGraph();
      if (u.node->kind() == aten::linear && u.input == 1) {
        Param* bias = nullptr;
        torch::jit::Value* bv = u.node->input(2);
        if (auto bpath = attr_path(bv, g->inputs()[0]); bpath && d.by_path.count(*bpath))
          bias = &d.params[d.by_path.at(*bpath)];
        linear_action(d, g, u.node, p, u.path, bias);
      } else if (u.node->kind() == aten::embedding && u.input == 0) {
        for (size_t i : {3, 4})
          if (!constant_false(u.node->input(i)))
            fail(p, "a split embedding needs scale_grad_by_freq and sparse to be False (" + where(u.node) + ")");
        d.actions.push_back(
            Action{g, u.node, p.role == Role::Column ? Role::Vocab : p.role, &p, nullptr, false, false, p.axis});
      }
    }
  (void)graphs;
}

// Every read of a cut tensor must be one the rewrite adjusts.
void check_reads(const Decisions& d) {
  for (const auto& p : d.params) {
    if (p.role == Role::Whole) continue;
    for (const Use& u : p.uses) {
      const auto k = u.node->kind();
      const bool ok = (k == aten::linear && u.input == 1 && p.role != Role::ColumnBias) ||
                      (k == aten::linear && u.input == 2 && p.role == Role::ColumnBias) ||
                      (k == aten::embedding && u.input == 0 && p.role != Role::ColumnBias) ||
                      ((k == aten::size || k == aten::dim) && u.input == 0);
      if (!ok)
        fail(p, std::string("is read by ") + k.toQualString() + " at " + where(u.node) +
                    ", which the TorchScript rewrite does not understand: a split parameter may only be the weight "
                    "of aten::linear or aten::embedding, or a column-parallel linear's bias" + rule_at(p));
    }
  }
}

void check_split_sizes(Param& p, const Mesh& mesh, int rank) {
  const auto shape = p.original.sizes().vec();
  const int64_t parts = mesh.axis_size(p.axis), index = mesh.coord(rank, p.axis);
  const int64_t dim = p.role == Role::Row || p.role == Role::EmbedDim ? 1 : 0;
  // A vocab-parallel embedding alone may be cut unevenly (shard_range); a
  // linear's output or input is all-gathered or scattered in equal parts.
  const bool uneven_ok = p.role == Role::Vocab;
  if (!uneven_ok && shape[dim] % (p.blocks * parts) != 0)
    fail(p, "dim " + std::to_string(dim) + " of size " + std::to_string(shape[dim]) +
                (p.blocks > 1 ? " in " + std::to_string(p.blocks) + " blocks" : "") + " is not divisible by mesh axis '" +
                p.axis + "' of size " + std::to_string(parts));
  p.splits = {ShardSplit{dim, p.axis, parts, index, p.blocks}};
}

}  // namespace

void decide(Decisions& d, const std::vector<std::shared_ptr<torch::jit::Graph>>& graphs, const Mesh& mesh, int rank) {
  collect_uses(d, graphs);
  for (auto& p : d.params) {
    check_tied(p);
    if (!planned(p)) continue;
    weight_role(p);
  }
  node_actions(d, graphs);
  for (auto& p : d.params) {
    if (planned(p) && p.role == Role::Whole) {
      std::string why = " (it is never read)";
      if (!p.uses.empty())
        why = ", nor as a column-parallel linear's bias; first read by " +
              std::string(p.uses.front().node->kind().toQualString()) + " at " + where(p.uses.front().node);
      fail(p, "is split by the plan but no rewritten method reads it as the weight of aten::linear or "
              "aten::embedding" + why);
    }
    if (p.role != Role::Whole) check_split_sizes(p, mesh, rank);
  }
  check_reads(d);
}

}  // namespace shardplan::script_detail
