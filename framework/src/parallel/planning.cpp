// plan_model: a plan applied to a model on paper, phase by phase. Here the
// phases up to grouping by module (the model walked, rules matched, one
// report row per parameter) and the Keras names in the report.
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shardplan/plugin_loader.h"
#include "plan/keras_paths.h"
#include "planning.h"

namespace shardplan::parallel_detail {

namespace {

ModelScan scan_model(torch::nn::Module& model, bool keras) {
  ModelScan scan;
  // apply() visits the root by reference under the prefix "" (users may hold
  // it on the stack, and named_modules() can only include it when it lives in
  // a shared_ptr), then every submodule under the name named_modules() gives
  // it, in the same order, without building named_modules()' dictionary.
  model.apply([&](const std::string& prefix, torch::nn::Module& m) {
    bool any = false;
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      if (!p.value().defined()) continue;
      if (!any) scan.module_paths.push_back(prefix);
      any = true;
      if (keras)
        scan.keras_names.push_back(
            detail::keras_name(type_of(m), prefix, p.key(), static_cast<size_t>(p.value().dim())));
      scan.infos.push_back({prefix.empty() ? p.key() : prefix + "." + p.key(), p.value().sizes().vec()});
      scan.owners.emplace_back(&m, p.key());
      scan.module_of.push_back(scan.module_paths.size() - 1);
      scan.tensor_of.push_back(p.value().unsafeGetTensorImpl());
    }
    if (!any) scan.bare.emplace_back(&m, prefix);
  });
  return scan;
}

// Rules see Keras names and shapes; what comes back is put in torch's names
// and axis order before any plugin sees it.
PlanMatch keras_match(const Planning& st, const std::vector<std::string>& bare_paths, int world_size) {
  const ModelScan& scan = st.scan;
  std::vector<ParamInfo> keras_infos;
  for (size_t i = 0; i < scan.infos.size(); ++i)
    keras_infos.push_back({scan.keras_names[i].path, detail::permuted(scan.infos[i].shape, scan.keras_names[i].perm)});
  std::vector<std::string> keras_bare;
  for (const auto& b : bare_paths) keras_bare.push_back(detail::keras_module_path(b));
  PlanMatch m = st.plan.assign(keras_infos, world_size, keras_bare, st.errors);
  for (size_t i = 0; i < scan.infos.size(); ++i) {
    m.params[i].path = scan.infos[i].path;
    m.params[i].shape = scan.infos[i].shape;
    m.params[i].layout = detail::torch_layout(m.params[i].layout, scan.keras_names[i].perm);
  }
  for (size_t j = 0; j < bare_paths.size() && j < m.modules.size(); ++j) m.modules[j].path = bare_paths[j];
  return m;
}

void match_rules(Planning& st, int world_size) {
  std::vector<std::string> bare_paths;
  bare_paths.reserve(st.scan.bare.size());
  for (const auto& b : st.scan.bare) bare_paths.push_back(b.second);
  st.match = st.keras ? keras_match(st, bare_paths, world_size)
                      : st.plan.assign(st.scan.infos, world_size, bare_paths, st.errors);
  st.matched_params.assign(st.plan.rules.size(), false);
  for (const Assignment& a : st.match.params)
    if (a.rule) st.matched_params[st.rule_index(a.rule)] = true;
  st.out.mesh = st.match.mesh;
  st.out.warnings = std::move(st.match.warnings);
}

ReportRow param_row(Planning& st, size_t i, const std::string& module_type) {
  const Assignment& a = st.match.params[i];
  ReportRow row;
  row.path = st.scan.infos[i].path;
  row.plan_path = st.keras ? st.scan.keras_names[i].path : row.path;
  row.module_type = module_type;
  if (a.rule) {
    const size_t r = st.rule_index(a.rule);
    row.rule = st.rule_loc[r];
    row.layout = st.keras ? layout_str(a.layout) : st.rule_layout[r];
  } else {
    auto u = st.unmatched_layout.find(a.layout.size());
    if (u == st.unmatched_layout.end()) u = st.unmatched_layout.emplace(a.layout.size(), layout_str(a.layout)).first;
    row.layout = u->second;
    row.note = "replicated, unmatched";
  }
  row.global_shape = st.scan.infos[i].shape;
  row.local_shape = st.scan.infos[i].shape;
  return row;
}

// Group by module, keeping first-seen order.
void group_by_module(Planning& st) {
  for (const Rule& r : st.plan.rules) {
    st.rule_loc.push_back(r.loc.str());
    st.rule_layout.push_back(layout_str(r.layout));
  }
  std::unordered_map<torch::nn::Module*, size_t> shard_of_module;
  st.out.rows.reserve(st.scan.infos.size());
  for (size_t i = 0; i < st.scan.infos.size(); ++i) {
    torch::nn::Module* m = st.scan.owners[i].first;
    auto it = shard_of_module.find(m);
    if (it == shard_of_module.end()) {
      ModuleShard s;
      s.path = st.scan.module_paths[st.scan.module_of[i]];
      s.type = st.type_names.of(*m);
      s.module = m;
      s.mesh = &st.out.mesh;
      s.rank = st.rank;
      it = shard_of_module.emplace(m, st.candidates.size()).first;
      st.candidates.push_back(std::move(s));
      st.candidate_rows.emplace_back();
    }
    ModuleShard& s = st.candidates[it->second];
    st.rule_of.push_back(st.match.params[i].rule);
    st.candidate_rows[it->second].push_back(st.out.rows.size());
    st.out.rows.push_back(param_row(st, i, s.type));

    ParamShard ps;
    ps.name = st.scan.owners[i].second;
    ps.local_shape = std::move(st.scan.infos[i].shape);
    ps.assignment = std::move(st.match.params[i]);
    s.params.push_back(std::move(ps));
  }
}

// Both names in the report: the torch path and layout in their columns, the
// Keras name and layout as the plan wrote them in the note.
void note_keras_names(Planning& st) {
  for (size_t i = 0; i < st.out.rows.size(); ++i) {
    ReportRow& row = st.out.rows[i];
    std::string k = "keras " + st.scan.keras_names[i].path;
    if (st.rule_of[i]) k += " " + st.rule_layout[st.rule_index(st.rule_of[i])];
    row.note = row.note.empty() ? k : k + "; " + row.note;
  }
}

}  // namespace

Planned plan_model(torch::nn::Module& model, const Plan& plan, int world_size, int rank,
                   std::vector<std::string>* errors) {
  PluginLoader::instance().add_plan_dirs(plan.plugin_dirs, plan.plugin_dir_locs);
  Planning st(plan, rank, errors);
  st.scan = scan_model(model, st.keras);
  st.out.plan_yaml = plan.to_yaml();
  match_rules(st, world_size);
  group_by_module(st);
  check_modules(st);
  if (st.keras) note_keras_names(st);
  check_ties(st);
  plan_bare_modules(st);
  plan_recompute(st, model);
  return std::move(st.out);
}

}  // namespace shardplan::parallel_detail
