// Modules with parameters checked by their layer plugin: which plugin, the
// sequence-parallel region, and the splits each plugin declares.
#include <algorithm>
#include <string>
#include <vector>

#include "shardplan/error.h"
#include "shardplan/shard.h"
#include "plan/plan_internal.h"
#include "planning.h"

namespace shardplan::parallel_detail {

using plan_detail::shape_str;

namespace {

std::string where(const Assignment& a) {
  return a.rule ? " (rule at " + a.rule->loc.str() + ")" : "";
}

bool all_replicated(const ModuleShard& s) {
  for (const auto& p : s.params)
    for (const auto& d : p.assignment.layout)
      if (d) return false;
  return true;
}

// The plugin's declared cuts of `p` (or the layout's axes), with parts and
// index for this rank, checked against the local shape the plugin reported:
// a plugin whose declaration does not describe its shard would otherwise
// break checkpoints silently.
std::vector<ShardSplit> resolve_splits(ParamShard& p, const Mesh& mesh, int rank, const std::string& plugin) {
  std::vector<ShardSplit> splits = p.splits;
  if (splits.empty())
    for (size_t d = 0; d < p.assignment.layout.size(); ++d)
      if (p.assignment.layout[d]) {
        ShardSplit s;
        s.dim = static_cast<int64_t>(d);
        s.axis = *p.assignment.layout[d];
        splits.push_back(s);
      }
  std::vector<int64_t> expect = p.assignment.shape;
  for (auto& s : splits) {
    if (s.dim < 0 || s.dim >= static_cast<int64_t>(expect.size()) || !mesh.has_axis(s.axis) || s.blocks < 1 ||
        expect[s.dim] % s.blocks != 0 || s.shared < 1 || mesh.axis_size(s.axis) % s.shared != 0)
      throw Error("layer plugin '" + plugin + "' declared an impossible split of parameter '" +
                  p.assignment.path + "' (dim " + std::to_string(s.dim) + ", axis '" + s.axis + "', " +
                  std::to_string(s.blocks) + " blocks, each piece on " + std::to_string(s.shared) + " ranks)");
    s.parts = mesh.axis_size(s.axis) / s.shared;
    s.index = mesh.coord(rank, s.axis) / s.shared;
    const auto range = shard_range(expect[s.dim] / s.blocks, s.parts, s.index);
    expect[s.dim] = (range.second - range.first) * s.blocks;
  }
  // Splits over an axis of size 1 (or into one piece every rank shares) cut
  // nothing.
  splits.erase(std::remove_if(splits.begin(), splits.end(), [](const ShardSplit& s) { return s.parts == 1; }),
               splits.end());
  if (expect != p.local_shape)
    throw Error("layer plugin '" + plugin + "' reports parameter '" + p.assignment.path + "' as " +
                shape_str(p.local_shape) + " on rank " + std::to_string(rank) + ", but the split it declares gives " +
                shape_str(expect) + " (a plugin must declare how it cuts each parameter: ParamShard::splits)");
  return splits;
}

// The layout a parameter no rule placed really has: the axes its plugin
// declared cutting it along (a column-parallel Linear's bias follows its
// weight: [model]), so the report and the checkpoint metadata do not call a
// [4]-of-[8] shard [null]. Taken from the declaration, before splits over
// an axis of size 1 are dropped, as a rule's layout keeps such an axis.
std::string declared_layout(const ParamShard& p) {
  Layout layout(p.assignment.shape.size());
  for (const ShardSplit& s : p.splits)
    if (s.dim >= 0 && s.dim < static_cast<int64_t>(layout.size()) && !layout[s.dim]) layout[s.dim] = s.axis;
  return layout_str(layout);
}

// A checked module's plugin results into its report rows, and the module
// into the plan.
void record_module(Planning& st, size_t c, LayerPlugin* plugin, const std::string& plugin_name) {
  ModuleShard& s = st.candidates[c];
  for (const auto& w : s.warnings) st.out.warnings.push_back(w);
  for (size_t k = 0; k < s.params.size(); ++k) {
    ParamShard& p = s.params[k];
    ReportRow& row = st.out.rows[st.candidate_rows[c][k]];
    row.plugin = plugin_name;
    row.local_shape = p.local_shape;
    if (!p.note.empty()) row.note = p.note;
    row.splits = resolve_splits(p, st.out.mesh, st.rank, plugin_name);
    if (!p.assignment.rule && !p.splits.empty()) row.layout = declared_layout(p);
    // A plugin may change the layout its rule gave (clear it to keep the
    // parameter whole): the row shows what is held.
    if (p.assignment.rule && !st.keras) row.layout = layout_str(p.assignment.layout);
  }
  st.out.plugins.push_back(plugin);
  st.out.shards.push_back(std::move(s));
}

// Nothing planned: stays replicated, no plugin needed. Except under
// sequence parallelism, where a layer may see a part of the sequence (a
// LayerNorm between blocks, whose gradients would then be this rank's part
// only) or the whole of it (after a gather), and guessing wrong is silent:
// the plan must say which.
void require_rule_under_sequence_parallel(const Plan& plan, const ModuleShard& s) {
  if (!plan.sequence_parallel.enabled) return;
  throw PlanError(plan.sequence_parallel.loc,
                  "under sequence_parallel every layer with parameters needs a rule, and module '" + s.path + "' (" +
                      s.type + ", parameter '" + s.params.front().assignment.path +
                      "') has none: add one with its layout (e.g. [null] for a LayerNorm's weight and bias: "
                      "replicated, run on this rank's part of the sequence, gradients all-reduced) or with "
                      "sequence_parallel: false if it sees whole activations");
}

void check_module(Planning& st, size_t c) {
  ModuleShard& s = st.candidates[c];
  const Plan& plan = st.plan;
  const Assignment* first_matched = nullptr;
  std::vector<const Rule*> module_rules;
  for (const auto& p : s.params) {
    if (p.assignment.rule && !first_matched) first_matched = &p.assignment;
    module_rules.push_back(p.assignment.rule);
  }
  if (!first_matched) {
    require_rule_under_sequence_parallel(plan, s);
    return;
  }
  s.sequence = sequence_of(plan, st.sequence_axis, module_rules, s.path);
  // A vanilla layer outside the sequence-parallel region that a rule
  // only confirms as replicated has nothing to be done to it.
  if (is_vanilla_torch(s.type) && plan.sequence_parallel.enabled && !s.sequence.on && all_replicated(s)) return;
  if (is_vanilla_torch(s.type))
    throw Error("parameter '" + first_matched->path + "'" + where(*first_matched) + " belongs to a " + s.type +
                ", which cannot be sharded: build the model with " + shardable_twin(s.type) +
                " (same options and parameter names)");
  std::string plugin_name;
  LayerPlugin* plugin = plugin_for(s.type, s, st.plugins, &plugin_name);
  if (!plugin)
    throw Error("parameter '" + first_matched->path + "'" + where(*first_matched) + " belongs to a module of type " +
                s.type + " that no layer plugin handles (searched: " + searched_dirs() + ")");
  if (s.sequence.on && !plugin->supports_sequence_parallel())
    throw PlanError(first_matched->rule->loc, "module '" + s.path + "' (" + s.type + ") is in the sequence-parallel "
                                              "region, but layer plugin '" + plugin_name +
                                              "' does not support sequence parallelism: give it "
                                              "sequence_parallel: false if it sees whole activations");
  plugin->check(s);
  record_module(st, c, plugin, plugin_name);
}

}  // namespace

void check_modules(Planning& st) {
  st.sequence_axis = st.plan.sequence_axis();
  for (size_t c = 0; c < st.candidates.size(); ++c) {
    try {
      check_module(st, c);
    } catch (const Error& e) {
      if (!st.errors) throw;
      st.errors->push_back(e.what());
      for (size_t k : st.candidate_rows[c]) st.out.rows[k].note = "not checked: the module has an error";
    }
  }
}

}  // namespace shardplan::parallel_detail
