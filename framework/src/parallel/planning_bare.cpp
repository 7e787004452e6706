// Modules without parameters (losses, dropouts, containers), reached by a
// rule over their path: the layout describes what flows into the module.
#include <string>
#include <utility>

#include "shardplan/error.h"
#include "planning.h"

namespace shardplan::parallel_detail {

namespace {

// Under sequence parallelism a parameterless layer whose plugin acts on the
// region (a dropout: one mask per part, or one for all) is as ambiguous as a
// LayerNorm without a rule.
void check_unruled(Planning& st, size_t i) {
  const Plan& plan = st.plan;
  if (!plan.sequence_parallel.enabled) return;
  ModuleShard probe;
  probe.type = st.type_names.of(*st.scan.bare[i].first);
  std::string plugin_name;
  LayerPlugin* plugin =
      is_vanilla_torch(probe.type) ? nullptr : plugin_for(probe.type, probe, st.plugins, &plugin_name);
  if (!plugin || !plugin->supports_sequence_parallel()) return;
  const PlanError err(plan.sequence_parallel.loc,
                      "under sequence_parallel module '" + st.match.modules[i].path + "' (" + probe.type +
                          ") needs a rule over its path: its layout describes its input ([null, ...] and "
                          "in the region: masks per sequence part) or sequence_parallel: false if it sees "
                          "whole activations");
  if (!st.errors) throw err;
  st.errors->push_back(err.what());
}

// The plugin of a module a rule matched by path. A catch-all parameter rule
// ('.*') also matches containers and activations; those are skipped
// (nullptr) when no plugin handles their type, so such plans keep working. A
// rule that matched only modules must reach a plugin, or it is a mistake
// worth reporting.
LayerPlugin* ruled_plugin(Planning& st, const ModuleShard& s, bool param_rule, std::string* plugin_name) {
  const std::string what = "module '" + (s.path.empty() ? std::string("<root>") : s.path) + "'";
  if (is_vanilla_torch(s.type)) {
    if (param_rule) return nullptr;
    throw PlanError(s.rule->pattern_loc, what + " is a " + s.type + ", which cannot be sharded: build the model with " +
                                             shardable_twin(s.type) + " (same options)");
  }
  LayerPlugin* plugin = nullptr;
  try {
    plugin = plugin_for(s.type, s, st.plugins, plugin_name);
  } catch (const Error&) {
    if (!param_rule) throw;  // e.g. its `plugin:` is meant for the parameters' modules
  }
  if (!plugin && !param_rule)
    throw PlanError(s.rule->pattern_loc, what + " matched by this rule has no parameters and is of type " + s.type +
                                             ", which no layer plugin handles (searched: " + searched_dirs() + ")");
  return plugin;
}

// The report row takes path, rule and layout from the match, whatever
// check() does to the shard.
void check_ruled(Planning& st, ModuleShard& s, const Assignment& a, bool param_rule) {
  s.sequence = sequence_of(st.plan, st.sequence_axis, {a.rule}, s.path);
  std::string plugin_name;
  LayerPlugin* plugin = ruled_plugin(st, s, param_rule, &plugin_name);
  if (!plugin) return;
  if (s.sequence.on && !plugin->supports_sequence_parallel()) s.sequence = SequenceShard{};
  plugin->check(s);
  ReportRow row;
  row.path = a.path;
  row.plan_path = a.path;
  row.module_type = s.type;
  row.rule = a.rule->loc.str();
  row.layout = layout_str(a.layout);
  row.plugin = plugin_name;
  row.note = s.note.empty() ? "module input" : s.note;
  st.out.rows.push_back(std::move(row));
  st.out.plugins.push_back(plugin);
  st.out.shards.push_back(std::move(s));
}

void plan_ruled(Planning& st, size_t i) {
  const Assignment& a = st.match.modules[i];
  ModuleShard s;
  s.path = a.path;
  s.type = st.type_names.of(*st.scan.bare[i].first);
  s.module = st.scan.bare[i].first;
  s.mesh = &st.out.mesh;
  s.rank = st.rank;
  s.rule = a.rule;
  s.layout = a.layout;
  try {
    check_ruled(st, s, a, st.matched_params[st.rule_index(a.rule)]);
  } catch (const Error& e) {
    if (!st.errors) throw;
    st.errors->push_back(e.what());
  }
}

}  // namespace

void plan_bare_modules(Planning& st) {
  for (size_t i = 0; i < st.scan.bare.size(); ++i) {
    if (st.match.modules[i].rule)
      plan_ruled(st, i);
    else
      check_unruled(st, i);
  }
}

}  // namespace shardplan::parallel_detail
