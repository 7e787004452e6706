#include "shardplan/parallelize.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Type.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <map>
#include <sstream>
#include <typeindex>
#include <typeinfo>
#include <unordered_map>
#include <utility>

#include "shardplan/agreement.h"
#include "shardplan/error.h"
#include "shardplan/helpers.h"
#include "shardplan/layer_plugin.h"
#include "shardplan/plugin_loader.h"
#include "shardplan/random.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"
#include "plan/keras_paths.h"
#include "plan/plan_internal.h"

namespace shardplan {

using plan_detail::shape_str;

namespace {

std::string type_of(const torch::nn::Module& m) { return c10::demangle(typeid(m).name()); }

bool is_vanilla_torch(const std::string& type) { return type.rfind("torch::nn::", 0) == 0; }

// "torch::nn::LinearImpl" -> "shardplan::nn::Linear"
std::string shardable_twin(const std::string& type) {
  std::string base = type.substr(std::string("torch::nn::").size());
  if (base.size() > 4 && base.compare(base.size() - 4, 4, "Impl") == 0) base.resize(base.size() - 4);
  return "shardplan::nn::" + base;
}

std::string where(const Assignment& a) {
  return a.rule ? " (rule at " + a.rule->loc.str() + ")" : "";
}

// One use of a tied tensor: the module registering it and its name there.
struct TieUse {
  torch::nn::Module* module;
  std::string name;
  std::string path;
};

struct Planned {
  std::vector<ModuleShard> shards;        // modules a plugin handles
  std::vector<LayerPlugin*> plugins;      // parallel to shards
  std::vector<ReportRow> rows;
  std::vector<std::string> warnings;
  Mesh mesh;
  std::vector<std::vector<TieUse>> ties;  // tensors registered more than once, first use first
  std::string plan_yaml;
};

struct PluginChoice {
  LayerPlugin* plugin;
  std::string name;
};
// Finding a plugin scans the plugin directories and loads what it finds, and
// models repeat a few module types thousands of times (a 10,000-parameter
// model spent 70% of plan_model here), so each (module type, requested
// plugin) is resolved once per plan application. Only successful lookups are
// kept: a failure throws at the first module that hits it, as before.
using PluginCache = std::map<std::pair<std::string, std::string>, PluginChoice>;

// Which plugin handles a type: the plan's `plugin:` option, else the first
// plugin on the search path that lists the type.
LayerPlugin* plugin_for(const std::string& type, const ModuleShard& shard, PluginCache& cache,
                        std::string* plugin_name) {
  auto& loader = PluginLoader::instance();
  std::string requested;
  const Assignment* requested_by = nullptr;
  if (const RuleOption* opt = shard.rule ? shard.rule->option("plugin") : nullptr) {
    requested = opt->value;
    requested_by = nullptr;
  }
  for (const auto& p : shard.params) {
    const RuleOption* opt = p.assignment.rule ? p.assignment.rule->option("plugin") : nullptr;
    if (!opt) continue;
    if (!requested.empty() && opt->value != requested)
      throw PlanError(opt->loc, "parameter '" + p.assignment.path + "' asks for plugin '" + opt->value +
                                    "' but '" + requested_by->path + "' of the same module asks for '" + requested +
                                    "'");
    requested = opt->value;
    requested_by = &p.assignment;
  }
  const auto key = std::make_pair(type, requested);
  if (auto hit = cache.find(key); hit != cache.end()) {
    *plugin_name = hit->second.name;
    return hit->second.plugin;
  }
  if (!requested.empty()) {
    const Rule* rule = requested_by ? requested_by->rule : shard.rule;
    LayerPlugin* plugin = nullptr;
    try {
      plugin = loader.layer(requested);
    } catch (const PluginError& e) {
      // A misspelt `plugin:` is a mistake in the plan: point at it.
      throw PlanError(rule->option("plugin")->loc, e.what());
    }
    auto types = plugin->module_types();
    if (std::find(types.begin(), types.end(), type) == types.end()) {
      const std::string path = requested_by ? requested_by->path : shard.path;
      throw PlanError(rule->option("plugin")->loc,
                      "plugin '" + requested + "' does not handle '" + path + "' of type " + type);
    }
    *plugin_name = plugin->name();
    cache.emplace(key, PluginChoice{plugin, *plugin_name});
    return plugin;
  }
  for (auto& entry : loader.all_layers()) {
    auto types = entry.second->module_types();
    if (std::find(types.begin(), types.end(), type) != types.end()) {
      *plugin_name = entry.second->name();
      cache.emplace(key, PluginChoice{entry.second, *plugin_name});
      return entry.second;
    }
  }
  return nullptr;
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
        expect[s.dim] % s.blocks != 0)
      throw Error("layer plugin '" + plugin + "' declared an impossible split of parameter '" +
                  p.assignment.path + "' (dim " + std::to_string(s.dim) + ", axis '" + s.axis + "', " +
                  std::to_string(s.blocks) + " blocks)");
    s.parts = mesh.axis_size(s.axis);
    s.index = mesh.coord(rank, s.axis);
    const auto range = shard_range(expect[s.dim] / s.blocks, s.parts, s.index);
    expect[s.dim] = (range.second - range.first) * s.blocks;
  }
  // Splits over an axis of size 1 cut nothing.
  splits.erase(std::remove_if(splits.begin(), splits.end(), [](const ShardSplit& s) { return s.parts == 1; }),
               splits.end());
  if (expect != p.local_shape)
    throw Error("layer plugin '" + plugin + "' reports parameter '" + p.assignment.path + "' as " +
                shape_str(p.local_shape) + " on rank " + std::to_string(rank) + ", but the split it declares gives " +
                shape_str(expect) + " (a plugin must declare how it cuts each parameter: ParamShard::splits)");
  return splits;
}

// What sequence parallelism means for a module whose parameters (or, for a
// module without any, whose path) the given rules placed: the plan's
// setting, unless a rule says `sequence_parallel: false` or names another
// `sequence_dim`. Rules of one module must agree.
SequenceShard sequence_of(const Plan& plan, const std::string& axis, const std::vector<const Rule*>& rules,
                          const std::string& module) {
  SequenceShard seq;
  if (!plan.sequence_parallel.enabled) return seq;
  seq.on = true;
  seq.axis = axis;
  seq.dim = plan.sequence_parallel.dim;
  // Each rule's answer (its option, else the plan's), and where it came from.
  const Rule* on_from = nullptr;
  const Rule* dim_from = nullptr;
  auto where = [](const Rule* r, const char* key) {
    const RuleOption* o = r->option(key);
    return o ? o->loc.str() : "the rule at " + r->loc.str() + " (the plan's setting)";
  };
  for (const Rule* r : rules) {
    if (!r) continue;
    const RuleOption* on = r->option("sequence_parallel");
    const bool rule_on = on ? on->value == "true" : true;
    if (on_from && rule_on != seq.on) {
      const SourceLoc& at = on ? on->loc : r->loc;
      throw PlanError(at, "module '" + module + "': sequence_parallel is " + (rule_on ? "true" : "false") +
                              " here but " + (seq.on ? "true" : "false") + " at " +
                              where(on_from, "sequence_parallel") + " (the rules of one layer must agree)");
    }
    if (!on_from) seq.on = rule_on;
    on_from = r;
    const RuleOption* d = r->option("sequence_dim");
    const int64_t rule_dim = d ? std::stoll(d->value) : plan.sequence_parallel.dim;
    if (dim_from && rule_dim != seq.dim)
      throw PlanError(d ? d->loc : r->loc, "module '" + module + "': sequence_dim is " + std::to_string(rule_dim) +
                                               " here but " + std::to_string(seq.dim) + " at " +
                                               where(dim_from, "sequence_dim") + " (the rules of one layer must agree)");
    seq.dim = rule_dim;
    dim_from = r;
  }
  if (!seq.on) seq = SequenceShard{};
  return seq;
}

bool all_replicated(const ModuleShard& s) {
  for (const auto& p : s.params)
    for (const auto& d : p.assignment.layout)
      if (d) return false;
  return true;
}

// With `errors`, a problem found in a module or a tie is appended there and
// checking goes on with the next one (the plan checker lists them all);
// without, the first one throws.
Planned plan_model(torch::nn::Module& model, const Plan& plan, int world_size, int rank,
                   std::vector<std::string>* errors = nullptr) {
  PluginLoader::instance().add_plan_dirs(plan.plugin_dirs, plan.plugin_dir_locs);

  // Every parameter with its owning module, in named_parameters() order.
  std::vector<ParamInfo> infos;
  std::vector<std::pair<torch::nn::Module*, std::string>> owners;  // (module, local name)
  std::vector<std::string> module_paths;                           // one per module visited
  std::vector<size_t> module_of;                                   // per parameter: index in module_paths
  std::vector<const void*> tensor_of;                              // per parameter: its TensorImpl (ties)
  std::vector<const Rule*> rule_of;                                // per parameter, kept for the tie check
  // Modules without parameters of their own (losses, activations,
  // containers) can only be reached by a rule over their module path.
  std::vector<std::pair<torch::nn::Module*, std::string>> bare;    // (module, path)
  // apply() visits the root by reference under the prefix "" (users may hold
  // it on the stack, and named_modules() can only include it when it lives in
  // a shared_ptr), then every submodule under the name named_modules() gives
  // it, in the same order, without building named_modules()' dictionary.
  // paths: keras: each parameter's Keras name and axis order (keras_paths.h).
  const bool keras = plan.paths == "keras";
  std::vector<detail::KerasName> keras_names;
  model.apply([&](const std::string& prefix, torch::nn::Module& m) {
    bool any = false;
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      if (!p.value().defined()) continue;
      if (!any) module_paths.push_back(prefix);
      any = true;
      if (keras)
        keras_names.push_back(detail::keras_name(type_of(m), prefix, p.key(), static_cast<size_t>(p.value().dim())));
      infos.push_back({prefix.empty() ? p.key() : prefix + "." + p.key(), p.value().sizes().vec()});
      owners.emplace_back(&m, p.key());
      module_of.push_back(module_paths.size() - 1);
      tensor_of.push_back(p.value().unsafeGetTensorImpl());
    }
    if (!any) bare.emplace_back(&m, prefix);
  });

  Planned out;
  out.plan_yaml = plan.to_yaml();
  std::vector<std::string> bare_paths;
  bare_paths.reserve(bare.size());
  for (const auto& b : bare) bare_paths.push_back(b.second);
  PlanMatch match = [&] {
    if (!keras) return plan.assign(infos, world_size, bare_paths, errors);
    // Rules see Keras names and shapes; what comes back is put in torch's
    // names and axis order before any plugin sees it.
    std::vector<ParamInfo> keras_infos;
    for (size_t i = 0; i < infos.size(); ++i)
      keras_infos.push_back({keras_names[i].path, detail::permuted(infos[i].shape, keras_names[i].perm)});
    std::vector<std::string> keras_bare;
    for (const auto& b : bare_paths) keras_bare.push_back(detail::keras_module_path(b));
    PlanMatch m = plan.assign(keras_infos, world_size, keras_bare, errors);
    for (size_t i = 0; i < infos.size(); ++i) {
      m.params[i].path = infos[i].path;
      m.params[i].shape = infos[i].shape;
      m.params[i].layout = detail::torch_layout(m.params[i].layout, keras_names[i].perm);
    }
    for (size_t j = 0; j < bare_paths.size() && j < m.modules.size(); ++j) m.modules[j].path = bare_paths[j];
    return m;
  }();
  std::vector<bool> matched_params(plan.rules.size(), false);  // by rule index
  for (const Assignment& a : match.params)
    if (a.rule) matched_params[static_cast<size_t>(a.rule - plan.rules.data())] = true;
  out.mesh = match.mesh;
  out.warnings = std::move(match.warnings);

  // Report strings that depend only on the rule (or, unmatched, on the rank
  // of the tensor), made once rather than once per parameter.
  std::vector<std::string> rule_loc, rule_layout;
  for (const Rule& r : plan.rules) {
    rule_loc.push_back(r.loc.str());
    rule_layout.push_back(layout_str(r.layout));
  }
  std::map<size_t, std::string> unmatched_layout;  // by tensor rank
  // c10::demangle per module was a visible cost on models with thousands of
  // modules of a handful of types.
  std::unordered_map<std::type_index, std::string> type_names;
  auto type_name = [&](const torch::nn::Module& m) -> const std::string& {
    auto type = type_names.find(std::type_index(typeid(m)));
    if (type == type_names.end()) type = type_names.emplace(std::type_index(typeid(m)), type_of(m)).first;
    return type->second;
  };

  // Group by module, keeping first-seen order.
  std::unordered_map<torch::nn::Module*, size_t> shard_of_module;
  std::vector<ModuleShard> candidates;
  std::vector<std::vector<size_t>> candidate_rows;  // parallel to candidates: index in out.rows per param
  out.rows.reserve(infos.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    torch::nn::Module* m = owners[i].first;
    auto it = shard_of_module.find(m);
    if (it == shard_of_module.end()) {
      ModuleShard s;
      s.path = module_paths[module_of[i]];
      s.type = type_name(*m);
      s.module = m;
      s.mesh = &out.mesh;
      s.rank = rank;
      it = shard_of_module.emplace(m, candidates.size()).first;
      candidates.push_back(std::move(s));
      candidate_rows.emplace_back();
    }
    Assignment& a = match.params[i];
    rule_of.push_back(a.rule);

    ReportRow row;
    row.path = infos[i].path;
    row.module_type = candidates[it->second].type;
    if (a.rule) {
      const size_t r = static_cast<size_t>(a.rule - plan.rules.data());
      row.rule = rule_loc[r];
      row.layout = keras ? layout_str(a.layout) : rule_layout[r];
    } else {
      auto u = unmatched_layout.find(a.layout.size());
      if (u == unmatched_layout.end()) u = unmatched_layout.emplace(a.layout.size(), layout_str(a.layout)).first;
      row.layout = u->second;
      row.note = "replicated, unmatched";
    }
    row.global_shape = infos[i].shape;
    row.local_shape = infos[i].shape;
    candidate_rows[it->second].push_back(out.rows.size());
    out.rows.push_back(std::move(row));

    ParamShard ps;
    ps.name = owners[i].second;
    ps.local_shape = std::move(infos[i].shape);
    ps.assignment = std::move(a);
    candidates[it->second].params.push_back(std::move(ps));
  }

  PluginCache plugins;
  const std::string sequence_axis = plan.sequence_axis();
  for (size_t c = 0; c < candidates.size(); ++c) {
    ModuleShard& s = candidates[c];
    const Assignment* first_matched = nullptr;
    std::vector<const Rule*> module_rules;
    for (const auto& p : s.params) {
      if (p.assignment.rule && !first_matched) first_matched = &p.assignment;
      module_rules.push_back(p.assignment.rule);
    }
    try {
      if (!first_matched) {
        // Nothing planned: stays replicated, no plugin needed. Except under
        // sequence parallelism, where a layer may see a part of the sequence
        // (a LayerNorm between blocks, whose gradients would then be this
        // rank's part only) or the whole of it (after a gather), and guessing
        // wrong is silent: the plan must say which.
        if (!plan.sequence_parallel.enabled) continue;
        throw PlanError(plan.sequence_parallel.loc,
                        "under sequence_parallel every layer with parameters needs a rule, and module '" + s.path +
                            "' (" + s.type + ", parameter '" + s.params.front().assignment.path +
                            "') has none: add one with its layout (e.g. [null] for a LayerNorm's weight and bias: "
                            "replicated, run on this rank's part of the sequence, gradients all-reduced) or with "
                            "sequence_parallel: false if it sees whole activations");
      }
      s.sequence = sequence_of(plan, sequence_axis, module_rules, s.path);
      // A vanilla layer outside the sequence-parallel region that a rule
      // only confirms as replicated has nothing to be done to it.
      if (is_vanilla_torch(s.type) && plan.sequence_parallel.enabled && !s.sequence.on && all_replicated(s)) continue;
      if (is_vanilla_torch(s.type))
        throw Error("parameter '" + first_matched->path + "'" + where(*first_matched) + " belongs to a " + s.type +
                    ", which cannot be sharded: build the model with " + shardable_twin(s.type) +
                    " (same options and parameter names)");
      std::string plugin_name;
      LayerPlugin* plugin = plugin_for(s.type, s, plugins, &plugin_name);
      if (!plugin) {
        std::string dirs;
        for (const auto& d : PluginLoader::instance().search_path()) dirs += (dirs.empty() ? "" : ", ") + d;
        throw Error("parameter '" + first_matched->path + "'" + where(*first_matched) + " belongs to a module of type " +
                    s.type + " that no layer plugin handles (searched: " + dirs + ")");
      }
      if (s.sequence.on && !plugin->supports_sequence_parallel())
        throw PlanError(first_matched->rule->loc, "module '" + s.path + "' (" + s.type + ") is in the sequence-parallel "
                                                  "region, but layer plugin '" + plugin_name +
                                                  "' does not support sequence parallelism: give it "
                                                  "sequence_parallel: false if it sees whole activations");
      plugin->check(s);
      for (const auto& w : s.warnings) out.warnings.push_back(w);
      for (size_t k = 0; k < s.params.size(); ++k) {
        ParamShard& p = s.params[k];
        ReportRow& row = out.rows[candidate_rows[c][k]];
        row.plugin = plugin_name;
        row.local_shape = p.local_shape;
        if (!p.note.empty()) row.note = p.note;
        row.splits = resolve_splits(p, out.mesh, rank, plugin_name);
      }
      out.plugins.push_back(plugin);
      out.shards.push_back(std::move(s));
    } catch (const Error& e) {
      if (!errors) throw;
      errors->push_back(e.what());
      for (size_t k : candidate_rows[c]) out.rows[k].note = "not checked: the module has an error";
    }
  }

  // Both names in the report: the torch path and layout in their columns,
  // the Keras name and layout as the plan wrote them in the note.
  if (keras)
    for (size_t i = 0; i < out.rows.size(); ++i) {
      ReportRow& row = out.rows[i];
      std::string k = "keras " + keras_names[i].path;
      if (rule_of[i]) k += " " + rule_layout[static_cast<size_t>(rule_of[i] - plan.rules.data())];
      row.note = row.note.empty() ? k : k + "; " + row.note;
    }

  // Tied parameters (one tensor in several modules) are sliced once, so every
  // use must be planned alike: same layout, same `blocks`, same local shape.
  {
    std::unordered_map<const void*, size_t> first_use;  // tensor -> its first parameter
    std::unordered_map<size_t, size_t> tie_of;          // first parameter -> index in out.ties
    auto blocks = [&](size_t i) {
      const RuleOption* o = rule_of[i] ? rule_of[i]->option("blocks") : nullptr;
      return o ? o->value : std::string("1");
    };
    for (size_t i = 0; i < infos.size(); ++i) {
      auto it = first_use.emplace(tensor_of[i], i);
      if (it.second) continue;
      const size_t f = it.first->second;
      const ReportRow& a = out.rows[f];
      ReportRow& b = out.rows[i];
      if (a.layout != b.layout || a.local_shape != b.local_shape || blocks(f) != blocks(i)) {
        auto desc = [&](size_t k) {
          const ReportRow& r = out.rows[k];
          return "'" + r.path + "' (layout " + r.layout + (r.rule.empty() ? ", unmatched" : ", rule at " + r.rule) +
                 (blocks(k) != "1" ? ", blocks " + blocks(k) : std::string()) + ", local shape " +
                 shape_str(r.local_shape) + ")";
        };
        const Rule* at = rule_of[i] ? rule_of[i] : rule_of[f];
        const PlanError err(at ? at->loc : SourceLoc{}, "tied parameters " + desc(f) + " and " + desc(i) +
                                                            " are one tensor but are planned differently: give both "
                                                            "the same layout (e.g. a vocab-parallel embedding "
                                                            "[model, null] and a column-parallel head [model, null]), "
                                                            "or untie them");
        if (!errors) throw err;
        errors->push_back(err.what());
      }
      b.tied_to = a.path;
      b.note += (b.note.empty() ? "" : "; ") + std::string("tied to ") + a.path;
      auto t = tie_of.emplace(f, out.ties.size());
      if (t.second) out.ties.push_back({TieUse{owners[f].first, owners[f].second, a.path}});
      out.ties[t.first->second].push_back(TieUse{owners[i].first, owners[i].second, b.path});
    }
  }

  // Rules over the path of a module without parameters: the layout describes
  // what flows into the module (a loss told its logits arrive sharded). A
  // catch-all parameter rule ('.*') also matches containers and activations;
  // those are skipped when no plugin handles their type, so such plans keep
  // working. A rule that matched only modules must reach a plugin, or it is
  // a mistake worth reporting.
  for (size_t i = 0; i < bare.size(); ++i) {
    Assignment& a = match.modules[i];
    if (!a.rule) {
      // Under sequence parallelism a parameterless layer whose plugin acts
      // on the region (a dropout: one mask per part, or one for all) is as
      // ambiguous as a LayerNorm without a rule.
      if (!plan.sequence_parallel.enabled) continue;
      ModuleShard probe;
      probe.type = type_name(*bare[i].first);
      std::string plugin_name;
      LayerPlugin* plugin = is_vanilla_torch(probe.type) ? nullptr : plugin_for(probe.type, probe, plugins, &plugin_name);
      if (!plugin || !plugin->supports_sequence_parallel()) continue;
      const PlanError err(plan.sequence_parallel.loc,
                          "under sequence_parallel module '" + a.path + "' (" + probe.type +
                              ") needs a rule over its path: its layout describes its input ([null, ...] and "
                              "in the region: masks per sequence part) or sequence_parallel: false if it sees "
                              "whole activations");
      if (!errors) throw err;
      errors->push_back(err.what());
      continue;
    }
    const bool param_rule = matched_params[static_cast<size_t>(a.rule - plan.rules.data())];
    torch::nn::Module* m = bare[i].first;
    ModuleShard s;
    s.path = a.path;
    s.type = type_name(*m);
    s.module = m;
    s.mesh = &out.mesh;
    s.rank = rank;
    s.rule = a.rule;
    s.layout = a.layout;
    const std::string what = "module '" + (a.path.empty() ? std::string("<root>") : a.path) + "'";
    try {
      s.sequence = sequence_of(plan, sequence_axis, {a.rule}, s.path);
      if (is_vanilla_torch(s.type)) {
        if (param_rule) continue;
        throw PlanError(a.rule->pattern_loc, what + " is a " + s.type + ", which cannot be sharded: build the model with " +
                                                 shardable_twin(s.type) + " (same options)");
      }
      std::string plugin_name;
      LayerPlugin* plugin = nullptr;
      try {
        plugin = plugin_for(s.type, s, plugins, &plugin_name);
      } catch (const Error&) {
        if (!param_rule) throw;  // e.g. its `plugin:` is meant for the parameters' modules
      }
      if (!plugin) {
        if (param_rule) continue;
        std::string dirs;
        for (const auto& d : PluginLoader::instance().search_path()) dirs += (dirs.empty() ? "" : ", ") + d;
        throw PlanError(a.rule->pattern_loc, what + " matched by this rule has no parameters and is of type " + s.type +
                                                 ", which no layer plugin handles (searched: " + dirs + ")");
      }
      if (s.sequence.on && !plugin->supports_sequence_parallel()) s.sequence = SequenceShard{};
      plugin->check(s);
      ReportRow row;
      row.path = a.path;
      row.module_type = s.type;
      row.rule = a.rule->loc.str();
      row.layout = layout_str(a.layout);
      row.plugin = plugin_name;
      row.note = s.note.empty() ? "module input" : s.note;
      out.rows.push_back(std::move(row));
      out.plugins.push_back(plugin);
      out.shards.push_back(std::move(s));
    } catch (const Error& e) {
      if (!errors) throw;
      errors->push_back(e.what());
    }
  }
  return out;
}

ParallelReport report_of(Planned&& p, int world_size, int rank, torch::nn::Module& model) {
  ParallelReport r;
  r.mesh = p.mesh;
  r.rank = rank;
  r.world_size = world_size;
  r.rows = std::move(p.rows);
  r.warnings = std::move(p.warnings);
  r.plan_yaml = p.plan_yaml;
  auto params = model.named_parameters(true);
  for (auto& row : r.rows) {
    auto* t = params.find(row.path);
    row.element_size = t ? static_cast<int64_t>(t->element_size()) : 0;
  }
  return r;
}

}  // namespace

std::shared_ptr<Communicator> ModuleShard::group(const std::string& axis) const {
  auto it = groups.find(axis);
  if (it == groups.end()) throw Error("module '" + path + "': no process group for mesh axis '" + axis + "'");
  return it->second;
}

ParamShard* ModuleShard::param(const std::string& name) {
  for (auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

const ParamShard* ModuleShard::param(const std::string& name) const {
  for (const auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

ParallelReport check_plan(torch::nn::Module& model, const Plan& plan, int world_size, int rank) {
  Planned p = plan_model(model, plan, world_size, rank);
  return report_of(std::move(p), world_size, rank, model);
}

ParallelReport check_plan(torch::nn::Module& model, const Plan& plan, int world_size, int rank,
                          std::vector<std::string>& errors) {
  Planned p = plan_model(model, plan, world_size, rank, &errors);
  return report_of(std::move(p), world_size, rank, model);
}

ParallelReport parallelize(torch::nn::Module& model, const Plan& plan, World& world) {
  // First, while the model is untouched: ranks that disagree would cut
  // incompatible shards, and one whose planning throws would leave the
  // others waiting in the group creation below.
  check_ranks_agree(model, plan, world.comm());
  Planned p = plan_model(model, plan, world.size(), world.rank());
  for (auto& s : p.shards) s.mesh = &p.mesh;  // p was moved out of plan_model
  // Groups are created collectively, so every rank asks for all of them even
  // when none of its modules needs one.
  auto groups = world.groups(p.mesh);
  // Dropout after this draws from per-rank streams over the plan's mesh.
  ensure_rng_tracker(world, p.mesh);
  // Slicing parameters into shards is not part of any graph; with grad mode
  // on, every narrow and copy of a parameter (which requires grad) would
  // record autograd nodes, which made up a third of applying a plan to a
  // 10,000-parameter model at world size 2.
  at::NoGradGuard no_grad;
  // A tied tensor is sliced by the first module's plugin for every module
  // sharing it. Each later module's plugin slices what its module holds, so
  // it gets the whole tensor back and must come out with the same shard.
  struct TieState {
    at::Tensor tensor, full, shard;
    std::string sliced_as;  // the parameter path whose plugin sliced it first
  };
  std::vector<TieState> tie_state(p.ties.size());
  std::unordered_map<torch::nn::Module*, std::vector<size_t>> ties_of;
  for (size_t t = 0; t < p.ties.size(); ++t) {
    tie_state[t].tensor = p.ties[t][0].module->named_parameters(false)[p.ties[t][0].name];
    tie_state[t].full = tie_state[t].tensor.detach();
    for (const TieUse& u : p.ties[t]) ties_of[u.module].push_back(t);
  }
  for (size_t i = 0; i < p.shards.size(); ++i) {
    p.shards[i].groups = groups;
    auto tied = ties_of.find(p.shards[i].module);
    if (tied != ties_of.end())
      for (size_t t : tied->second)
        if (tie_state[t].shard.defined()) tie_state[t].tensor.set_data(tie_state[t].full);
    p.plugins[i]->apply(p.shards[i]);
    if (tied == ties_of.end()) continue;
    for (size_t t : tied->second) {
      TieState& st = tie_state[t];
      std::string path;
      for (const TieUse& u : p.ties[t])
        if (u.module == p.shards[i].module) path = u.path;
      if (!st.shard.defined()) {
        st.shard = st.tensor.detach();
        st.sliced_as = path;
      } else if (st.tensor.sizes() != st.shard.sizes() || !st.tensor.equal(st.shard)) {
        throw Error("tied parameters '" + st.sliced_as + "' and '" + path +
                    "' are one tensor, but their layer plugins cut different shards from it (" +
                    shape_str(st.shard.sizes().vec()) + " and " + shape_str(st.tensor.sizes().vec()) + " on rank " +
                    std::to_string(world.rank()) + "): plan them alike or untie them");
      }
    }
  }
  for (size_t t = 0; t < p.ties.size(); ++t)
    for (const TieUse& u : p.ties[t]) {
      auto params = u.module->named_parameters(false);
      const at::Tensor* now = params.find(u.name);
      if (!now || now->unsafeGetTensorImpl() != tie_state[t].tensor.unsafeGetTensorImpl())
        throw Error("parameter '" + u.path + "' was tied to '" + p.ties[t][0].path +
                    "', but its layer plugin registered a new tensor for it: the tie would be lost");
    }
  ParallelReport report = report_of(std::move(p), world.size(), world.rank(), model);
  // get_parallel_dim(param) answers for what a plan cut as for what a user
  // declared by hand (helpers.h).
  auto params = model.named_parameters();
  for (const ReportRow& row : report.rows)
    if (!row.splits.empty())
      if (const at::Tensor* t = params.find(row.path)) register_parallel_split(*t, row.splits.front());
  return report;
}

}  // namespace shardplan
