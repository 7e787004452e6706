// Module types and the layer plugin that handles each: the plan's `plugin:`
// option or the search path, looked up once per (type, request).
#include <c10/util/Type.h>

#include <algorithm>
#include <typeinfo>

#include "shardplan/error.h"
#include "shardplan/plugin_loader.h"
#include "planning.h"

namespace shardplan::parallel_detail {

namespace {

// The `plugin:` the shard's rules ask for ("" when none), and the parameter
// whose rule asked (nullptr when it is the module's own rule). Rules of one
// module must agree.
std::string requested_plugin(const ModuleShard& shard, const Assignment** requested_by) {
  std::string requested;
  *requested_by = nullptr;
  if (const RuleOption* opt = shard.rule ? shard.rule->option("plugin") : nullptr) {
    requested = opt->value;
    *requested_by = nullptr;
  }
  for (const auto& p : shard.params) {
    const RuleOption* opt = p.assignment.rule ? p.assignment.rule->option("plugin") : nullptr;
    if (!opt) continue;
    if (!requested.empty() && opt->value != requested)
      throw PlanError(opt->loc, "parameter '" + p.assignment.path + "' asks for plugin '" + opt->value +
                                    "' but '" + (*requested_by)->path + "' of the same module asks for '" +
                                    requested + "'");
    requested = opt->value;
    *requested_by = &p.assignment;
  }
  return requested;
}

LayerPlugin* load_requested(const std::string& requested, const Assignment* requested_by, const std::string& type,
                            const ModuleShard& shard) {
  const Rule* rule = requested_by ? requested_by->rule : shard.rule;
  LayerPlugin* plugin = nullptr;
  try {
    plugin = PluginLoader::instance().layer(requested);
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
  return plugin;
}

}  // namespace

std::string type_of(const torch::nn::Module& m) { return c10::demangle(typeid(m).name()); }

bool is_vanilla_torch(const std::string& type) { return type.rfind("torch::nn::", 0) == 0; }

std::string shardable_twin(const std::string& type) {
  std::string base = type.substr(std::string("torch::nn::").size());
  if (base.size() > 4 && base.compare(base.size() - 4, 4, "Impl") == 0) base.resize(base.size() - 4);
  return "shardplan::nn::" + base;
}

std::string searched_dirs() {
  std::string dirs;
  for (const auto& d : PluginLoader::instance().search_path()) dirs += (dirs.empty() ? "" : ", ") + d;
  return dirs;
}

const std::string& TypeNames::of(const torch::nn::Module& m) {
  auto type = names_.find(std::type_index(typeid(m)));
  if (type == names_.end()) type = names_.emplace(std::type_index(typeid(m)), type_of(m)).first;
  return type->second;
}

LayerPlugin* plugin_for(const std::string& type, const ModuleShard& shard, PluginCache& cache,
                        std::string* plugin_name) {
  const Assignment* requested_by = nullptr;
  const std::string requested = requested_plugin(shard, &requested_by);
  const auto key = std::make_pair(type, requested);
  if (auto hit = cache.find(key); hit != cache.end()) {
    *plugin_name = hit->second.name;
    return hit->second.plugin;
  }
  if (!requested.empty()) {
    LayerPlugin* plugin = load_requested(requested, requested_by, type, shard);
    *plugin_name = plugin->name();
    cache.emplace(key, PluginChoice{plugin, *plugin_name});
    return plugin;
  }
  for (auto& entry : PluginLoader::instance().all_layers()) {
    auto types = entry.second->module_types();
    if (std::find(types.begin(), types.end(), type) != types.end()) {
      *plugin_name = entry.second->name();
      cache.emplace(key, PluginChoice{entry.second, *plugin_name});
      return entry.second;
    }
  }
  return nullptr;
}

}  // namespace shardplan::parallel_detail
