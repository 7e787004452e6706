#include "shardplan/parallelize.h"

#include <c10/util/Type.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <iomanip>
#include <map>
#include <sstream>
#include <typeinfo>

#include "shardplan/error.h"
#include "shardplan/layer_plugin.h"
#include "shardplan/plugin_loader.h"
#include "shardplan/world.h"

namespace shardplan {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

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

struct Planned {
  std::vector<ModuleShard> shards;        // modules a plugin handles
  std::vector<LayerPlugin*> plugins;      // parallel to shards
  std::vector<ReportRow> rows;
  std::map<std::string, size_t> row_of;   // path -> index in rows
  std::vector<std::string> warnings;
  Mesh mesh;
};

// Which plugin handles a type: the plan's `plugin:` option, else the first
// plugin on the search path that lists the type.
LayerPlugin* plugin_for(const std::string& type, const ModuleShard& shard, std::string* plugin_name) {
  auto& loader = PluginLoader::instance();
  std::string requested;
  const Assignment* requested_by = nullptr;
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
  if (!requested.empty()) {
    LayerPlugin* plugin = loader.layer(requested);
    auto types = plugin->module_types();
    if (std::find(types.begin(), types.end(), type) == types.end())
      throw PlanError(requested_by->rule->option("plugin")->loc,
                      "plugin '" + requested + "' does not handle '" + requested_by->path + "' of type " + type);
    *plugin_name = plugin->name();
    return plugin;
  }
  for (auto& entry : loader.all_layers()) {
    auto types = entry.second->module_types();
    if (std::find(types.begin(), types.end(), type) != types.end()) {
      *plugin_name = entry.second->name();
      return entry.second;
    }
  }
  return nullptr;
}

Planned plan_model(torch::nn::Module& model, const Plan& plan, int world_size, int rank) {
  PluginLoader::instance().add_dirs(plan.plugin_dirs);

  // Every parameter with its owning module, in named_parameters() order.
  std::vector<ParamInfo> infos;
  std::vector<std::pair<torch::nn::Module*, std::string>> owners;  // (module, local name)
  std::vector<std::string> module_paths;
  auto collect = [&](torch::nn::Module& m, const std::string& prefix) {
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      if (!p.value().defined()) continue;
      infos.push_back({prefix.empty() ? p.key() : prefix + "." + p.key(), p.value().sizes().vec()});
      owners.emplace_back(&m, p.key());
      module_paths.push_back(prefix);
    }
  };
  // The root is visited by reference: users may hold it on the stack, and
  // named_modules() can only include it when it lives in a shared_ptr.
  collect(model, "");
  for (const auto& item : model.named_modules("", /*include_self=*/false)) collect(*item.value(), item.key());

  Planned out;
  PlanMatch match = plan.assign(infos, world_size);
  out.mesh = match.mesh;
  out.warnings = match.warnings;

  // Group by module, keeping first-seen order.
  std::map<torch::nn::Module*, size_t> shard_of_module;
  std::vector<ModuleShard> candidates;
  for (size_t i = 0; i < infos.size(); ++i) {
    torch::nn::Module* m = owners[i].first;
    auto it = shard_of_module.find(m);
    if (it == shard_of_module.end()) {
      ModuleShard s;
      s.path = module_paths[i];
      s.type = type_of(*m);
      s.module = m;
      s.mesh = &out.mesh;
      s.rank = rank;
      it = shard_of_module.emplace(m, candidates.size()).first;
      candidates.push_back(std::move(s));
    }
    ParamShard ps;
    ps.name = owners[i].second;
    ps.assignment = match.params[i];
    ps.local_shape = infos[i].shape;
    candidates[it->second].params.push_back(std::move(ps));

    ReportRow row;
    row.path = infos[i].path;
    row.module_type = candidates[it->second].type;
    row.rule = match.params[i].rule ? match.params[i].rule->loc.str() : "";
    row.layout = layout_str(match.params[i].layout);
    row.global_shape = infos[i].shape;
    row.local_shape = infos[i].shape;
    row.note = match.params[i].rule ? "" : "replicated, unmatched";
    out.row_of[row.path] = out.rows.size();
    out.rows.push_back(std::move(row));
  }

  for (auto& s : candidates) {
    const Assignment* first_matched = nullptr;
    for (const auto& p : s.params)
      if (p.assignment.rule && !first_matched) first_matched = &p.assignment;
    if (!first_matched) continue;  // nothing planned: stays replicated, no plugin needed
    if (is_vanilla_torch(s.type))
      throw Error("parameter '" + first_matched->path + "'" + where(*first_matched) + " belongs to a " + s.type +
                  ", which cannot be sharded: build the model with " + shardable_twin(s.type) +
                  " (same options and parameter names)");
    std::string plugin_name;
    LayerPlugin* plugin = plugin_for(s.type, s, &plugin_name);
    if (!plugin) {
      std::string dirs;
      for (const auto& d : PluginLoader::instance().search_path()) dirs += (dirs.empty() ? "" : ", ") + d;
      throw Error("parameter '" + first_matched->path + "'" + where(*first_matched) + " belongs to a module of type " +
                  s.type + " that no layer plugin handles (searched: " + dirs + ")");
    }
    plugin->check(s);
    for (const auto& p : s.params) {
      ReportRow& row = out.rows[out.row_of[p.assignment.path]];
      row.plugin = plugin_name;
      row.local_shape = p.local_shape;
      if (!p.note.empty()) row.note = p.note;
    }
    out.plugins.push_back(plugin);
    out.shards.push_back(std::move(s));
  }
  return out;
}

ParallelReport report_of(const Planned& p, int world_size, int rank, torch::nn::Module& model) {
  ParallelReport r;
  r.mesh = p.mesh;
  r.rank = rank;
  r.world_size = world_size;
  r.rows = p.rows;
  r.warnings = p.warnings;
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
  return report_of(p, world_size, rank, model);
}

ParallelReport parallelize(torch::nn::Module& model, const Plan& plan, World& world) {
  Planned p = plan_model(model, plan, world.size(), world.rank());
  for (auto& s : p.shards) s.mesh = &p.mesh;  // p was moved out of plan_model
  // Groups are created collectively, so every rank asks for all of them even
  // when none of its modules needs one.
  auto groups = world.groups(p.mesh);
  for (size_t i = 0; i < p.shards.size(); ++i) {
    p.shards[i].groups = groups;
    p.plugins[i]->apply(p.shards[i]);
  }
  return report_of(p, world.size(), world.rank(), model);
}

int64_t ParallelReport::local_bytes() const {
  int64_t total = 0;
  for (const auto& r : rows) {
    int64_t n = 1;
    for (auto d : r.local_shape) n *= d;
    total += n * r.element_size;
  }
  return total;
}

int64_t ParallelReport::global_bytes() const {
  int64_t total = 0;
  for (const auto& r : rows) {
    int64_t n = 1;
    for (auto d : r.global_shape) n *= d;
    total += n * r.element_size;
  }
  return total;
}

std::string ParallelReport::table() const {
  std::ostringstream os;
  os << "mesh " << mesh.str() << ", rank " << rank << " of " << world_size << "\n";
  size_t w = 9;
  for (const auto& r : rows) w = std::max(w, r.path.size());
  os << std::left << std::setw(static_cast<int>(w) + 2) << "parameter" << std::setw(16) << "layout"
     << std::setw(14) << "global" << std::setw(14) << "local" << std::setw(8) << "plugin"
     << "rule / note\n";
  for (const auto& r : rows) {
    os << std::setw(static_cast<int>(w) + 2) << r.path << std::setw(16) << r.layout << std::setw(14)
       << shape_str(r.global_shape) << std::setw(14) << shape_str(r.local_shape) << std::setw(8)
       << (r.plugin.empty() ? "-" : r.plugin) << (r.rule.empty() ? "" : r.rule + " ") << r.note << "\n";
  }
  for (const auto& wmsg : warnings) os << "warning: " << wmsg << "\n";
  os << "parameter bytes on this rank: " << local_bytes() << " of " << global_bytes() << "\n";
  return os.str();
}

}  // namespace shardplan
