// What a plan makes of a TorchScript module: each planned parameter's cut is
// decided by the rewrite registered for the op its read feeds
// (shardplan/script_rewrite.h), and every read of it must be one a rewrite
// adjusts, or the module would run with a shard where it expects the whole
// tensor.
#include "script_decide.h"

#include "script_internal.h"
#include "shardplan/error.h"
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
  return " (no rule: it follows the parameter it is cut with)";
}

const Assignment& assignment_of(const Param& p, const std::string& path) {
  for (size_t i = 0; i < p.paths.size(); ++i)
    if (p.paths[i] == path) return *p.assignments[i];
  return *p.assignments.front();
}

// A tensor passed in a list or tuple (torch.einsum's operands, torch.cat's)
// is read by the op the list feeds, and the list's own node has no source:
// "aten::einsum (input 1, in a list) at model.py:12:9".
std::string read_by(const Use& u) {
  const Node* n = u.node;
  std::string how = " (input " + std::to_string(u.input);
  for (int depth = 0; depth < 4; ++depth) {
    const auto k = n->kind();
    if ((k != torch::jit::prim::ListConstruct && k != torch::jit::prim::TupleConstruct) ||
        n->output()->uses().size() != 1)
      break;
    const auto& next = n->output()->uses().front();
    n = next.user;
    how = " (input " + std::to_string(next.offset) + ", in a list";
  }
  return std::string(n->kind().toQualString()) + how + ") at " + where(n);
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

std::string axis_of(const Layout& l) {
  for (const auto& a : l)
    if (a) return *a;
  return "";
}

// The cut one rewrite asks of one read, merged into the parameter's: a tied
// embedding and LM head both cut vocabulary rows, which is one cut.
void decide_read(Decisions& d, Param& p, const Use& u, const ScriptRewrite& rw) {
  const Assignment& a = assignment_of(p, u.path);
  ScriptRead read{u.node, u.input, u.path, p.original.sizes().vec(), a.layout, a.rule};
  ScriptCut cut;
  const std::string at = std::string(u.node->kind().toQualString()) + " at " + where(u.node);
  try {
    cut = rw.decide(read);
  } catch (const PlanError&) {
    throw;
  } catch (const std::exception& e) {
    fail(p, "read by " + at + ": " + e.what());
  }
  if (p.split && (p.dim != cut.dim || p.blocks != cut.blocks))
    fail(p, "is read by ops that need it cut two ways (" + at + " is one); this layout cannot serve both");
  if (!p.split) p.note = cut.note;
  p.split = true;
  p.dim = cut.dim;
  p.blocks = cut.blocks;
  p.uneven = p.uneven && cut.uneven;
  p.axis = axis_of(a.layout);
  d.actions.push_back(Action{&rw, read, cut, &p});
}

Param* param_at(Decisions& d, Node* n, size_t input) {
  auto path = attr_path(n->input(input), n->owningGraph()->inputs()[0]);
  if (!path || !d.by_path.count(*path)) return nullptr;
  return &d.params[d.by_path.at(*path)];
}

// A follower (a column-parallel bias) is cut with its parameter; a rule
// for it must say the same.
void follow(Decisions& d, const Action& a) {
  for (const ScriptFollower& f : a.cut.followers) {
    Param* b = param_at(d, f.node, f.input);
    if (!b) continue;
    Layout want(b->original.dim());
    want.at(f.dim) = a.param->axis;
    for (const Assignment* ba : b->assignments)
      if (ba->rule && ba->layout != want)
        fail(*b, "is cut with '" + a.read.path + "' (" + a.cut.note + "): its layout must be " + layout_str(want) +
                     ", got " + layout_str(ba->layout));
    b->split = true;
    b->dim = f.dim;
    b->blocks = a.param->blocks;
    b->uneven = false;
    b->axis = a.param->axis;
    b->follows = a.read.path;
    b->note = "follows '" + a.read.path + "'";
  }
  for (const ScriptWhole& w : a.cut.whole) {
    Param* b = param_at(d, w.node, w.input);
    if (b && planned(*b)) fail(*b, w.why);
  }
}

// Every read of a cut tensor must be one a rewrite adjusts.
bool adjusted(const Decisions& d, const Param& p, const Use& u) {
  const auto k = u.node->kind();
  if ((k == aten::size || k == aten::dim) && u.input == 0) return true;
  for (const Action& a : d.actions) {
    if (a.read.node == u.node && a.read.input == u.input) return true;
    for (const ScriptFollower& f : a.cut.followers)
      if (f.node == u.node && f.input == u.input && !p.follows.empty()) return true;
  }
  return false;
}

void check_reads(const Decisions& d) {
  for (const auto& p : d.params) {
    if (!p.split) continue;
    for (const Use& u : p.uses)
      if (!adjusted(d, p, u))
        fail(p, "is read by " + read_by(u) + ", which no TorchScript rewrite handles: a split parameter may only " +
                    "be read where a rewrite is registered (" + script_rewrite_keys() + ")" + rule_at(p));
  }
}

void check_split_sizes(Param& p, const Mesh& mesh, int rank) {
  const auto shape = p.original.sizes().vec();
  const int64_t parts = mesh.axis_size(p.axis), index = mesh.coord(rank, p.axis);
  // A vocab-parallel embedding alone may be cut unevenly (shard_range); a
  // linear's output or input is all-gathered or scattered in equal parts.
  if (!p.uneven && shape[p.dim] % (p.blocks * parts) != 0)
    fail(p, "dim " + std::to_string(p.dim) + " of size " + std::to_string(shape[p.dim]) +
                (p.blocks > 1 ? " in " + std::to_string(p.blocks) + " blocks" : "") +
                " is not divisible by mesh axis '" + p.axis + "' of size " + std::to_string(parts));
  p.splits = {ShardSplit{p.dim, p.axis, parts, index, p.blocks}};
}

}  // namespace

void fail(const Param& p, const std::string& what) {
  for (const Assignment* a : p.assignments)
    if (a->rule) throw PlanError(a->rule->loc, "parameter '" + p.paths.front() + "': " + what);
  throw Error("parameter '" + p.paths.front() + "': " + what);
}

void decide(Decisions& d, const std::vector<std::shared_ptr<torch::jit::Graph>>& graphs, const Mesh& mesh, int rank) {
  collect_uses(d, graphs);
  for (auto& p : d.params) {
    check_tied(p);
    if (!planned(p)) continue;
    for (const Use& u : p.uses)
      if (const ScriptRewrite* rw = find_script_rewrite(u.node->kind().toQualString(), u.input))
        decide_read(d, p, u, *rw);
  }
  for (const Action& a : d.actions) follow(d, a);
  for (auto& p : d.params) {
    if (planned(p) && !p.split) {
      // An RNN reads its weights through its _flat_weights list, never by name.
      std::string why = " (it is never read by name; an RNN's weights are read through its _flat_weights list, "
                        "which no rewrite cuts: leave them replicated)";
      if (!p.uses.empty())
        why = "; first read by " + read_by(p.uses.front());
      fail(p, "is split by the plan but no rewritten method reads it where a TorchScript rewrite is registered (" +
                  script_rewrite_keys() + "), nor is it cut with a parameter that is" + why);
    }
    if (p.split) check_split_sizes(p, mesh, rank);
  }
  check_reads(d);
}

}  // namespace shardplan::script_detail
