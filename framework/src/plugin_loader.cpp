#include "shardplan/plugin_loader.h"

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "shardplan/error.h"
#include "shardplan/layer_plugin.h"

namespace shardplan {
namespace fs = std::filesystem;

namespace {

const char* kind_name(uint32_t kind) {
  switch (kind) {
    case SP_PLUGIN_COMM: return "comm";
    case SP_PLUGIN_LAYER: return "layer";
    default: return "unknown";
  }
}

uint32_t expected_abi(uint32_t kind) {
  return kind == SP_PLUGIN_COMM ? SP_COMM_ABI_VERSION : SHARDPLAN_LAYER_ABI_VERSION;
}

std::vector<std::string> split_path_list(const char* value) {
  std::vector<std::string> out;
  if (!value) return out;
  std::stringstream ss(value);
  std::string item;
  while (std::getline(ss, item, ':'))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

struct PluginLoader::Impl {
  std::mutex mu;
  std::vector<std::string> dirs;
  // Never destroyed (see header): the map and libraries are leaked on purpose.
  std::map<std::string, std::unique_ptr<boost::dll::shared_library>> libs;
  std::map<std::string, std::unique_ptr<LoadedPlugin>> by_path;
  std::map<std::string, LayerPlugin*> layer_objects;  // by path
  bool scanned_layers = false;
};

PluginLoader& PluginLoader::instance() {
  static PluginLoader* loader = new PluginLoader();
  return *loader;
}

PluginLoader::Impl& PluginLoader::impl() {
  static Impl* impl = new Impl();
  return *impl;
}

void PluginLoader::add_dirs(const std::vector<std::string>& dirs) {
  auto& m = impl();
  std::lock_guard<std::mutex> lock(m.mu);
  for (const auto& d : dirs) {
    std::string abs = fs::absolute(d).lexically_normal().string();
    bool known = false;
    for (const auto& e : m.dirs) known = known || e == abs;
    if (!known) {
      m.dirs.push_back(abs);
      m.scanned_layers = false;
    }
  }
}

std::vector<std::string> PluginLoader::search_path() const {
  auto& m = const_cast<PluginLoader*>(this)->impl();
  std::vector<std::string> path;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    path = m.dirs;
  }
  for (auto& d : split_path_list(std::getenv("SHARDPLAN_PLUGIN_PATH"))) path.push_back(d);
  path.push_back(default_plugin_dir());
  return path;
}

const LoadedPlugin& PluginLoader::load_file(const std::string& path_in, sp_plugin_kind expected_kind) {
  auto& m = impl();
  std::string path = fs::absolute(path_in).lexically_normal().string();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.by_path.find(path);
  if (it != m.by_path.end()) {
    if (it->second->info->kind != static_cast<uint32_t>(expected_kind))
      throw PluginError(path + ": is a " + kind_name(it->second->info->kind) + " plugin, expected a " +
                        kind_name(expected_kind) + " plugin");
    return *it->second;
  }
  if (!fs::exists(path)) throw PluginError(path + ": plugin file does not exist");

  auto lib = std::make_unique<boost::dll::shared_library>();
  boost::dll::fs::error_code ec;
  // RTLD_NOW: an unresolved symbol fails here with a message, not later with a crash.
  lib->load(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
  if (ec || !lib->is_loaded()) {
    const char* why = dlerror();
    throw PluginError(path + ": cannot load plugin: " + (why ? why : ec.message()));
  }
  if (!lib->has(SP_PLUGIN_ENTRY_SYMBOL))
    throw PluginError(path + ": not a shardplan plugin (no '" SP_PLUGIN_ENTRY_SYMBOL "' entry point)");
  auto entry = lib->get<const sp_plugin_info*()>(SP_PLUGIN_ENTRY_SYMBOL);
  const sp_plugin_info* info = entry();
  if (!info) throw PluginError(path + ": entry point returned no plugin description");
  if (info->entry_version != SP_PLUGIN_ENTRY_VERSION)
    throw PluginError(path + ": plugin entry version " + std::to_string(info->entry_version) +
                      ", this shardplan expects " + std::to_string(SP_PLUGIN_ENTRY_VERSION) +
                      " (rebuild the plugin against this shardplan)");
  if (info->kind != static_cast<uint32_t>(expected_kind))
    throw PluginError(path + ": is a " + kind_name(info->kind) + " plugin, expected a " +
                      kind_name(expected_kind) + " plugin");
  if (info->abi_version != expected_abi(info->kind))
    throw PluginError(path + ": " + kind_name(info->kind) + " plugin ABI version " +
                      std::to_string(info->abi_version) + ", this shardplan expects " +
                      std::to_string(expected_abi(info->kind)) +
                      " (rebuild the plugin against this shardplan)");
  if (!info->factory || !info->name) throw PluginError(path + ": plugin description lacks a name or factory");

  auto loaded = std::make_unique<LoadedPlugin>(LoadedPlugin{path, info});
  const LoadedPlugin& ref = *loaded;
  m.libs[path] = std::move(lib);
  m.by_path[path] = std::move(loaded);
  return ref;
}

const LoadedPlugin& PluginLoader::load(sp_plugin_kind kind, const std::string& name) {
  if (name.find('/') != std::string::npos) return load_file(name, kind);
  std::string file = std::string("libshardplan_") + kind_name(kind) + "_" + name + ".so";
  auto dirs = search_path();
  for (const auto& d : dirs) {
    fs::path p = fs::path(d) / file;
    if (fs::exists(p)) return load_file(p.string(), kind);
  }
  std::string searched;
  for (const auto& d : dirs) searched += (searched.empty() ? "" : ", ") + d;
  throw PluginError(std::string("no ") + kind_name(kind) + " plugin '" + name + "': " + file +
                    " not found in [" + searched + "] (set SHARDPLAN_PLUGIN_PATH or the plan's plugins:)");
}

const sp_comm_api* PluginLoader::comm(const std::string& name) {
  const LoadedPlugin& p = load(SP_PLUGIN_COMM, name);
  auto api = static_cast<const sp_comm_api*>(p.info->factory());
  if (!api || api->abi_version != SP_COMM_ABI_VERSION || api->struct_size < sizeof(sp_comm_api))
    throw PluginError(p.path + ": comm plugin returned an incompatible function table");
  return api;
}

LayerPlugin* PluginLoader::layer(const std::string& name) {
  const LoadedPlugin& p = load(SP_PLUGIN_LAYER, name);
  auto& m = impl();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.layer_objects.find(p.path);
  if (it != m.layer_objects.end()) return it->second;
  auto obj = static_cast<LayerPlugin*>(const_cast<void*>(p.info->factory()));
  if (!obj) throw PluginError(p.path + ": layer plugin factory returned null");
  m.layer_objects[p.path] = obj;
  return obj;
}

std::vector<std::pair<const LoadedPlugin*, LayerPlugin*>> PluginLoader::all_layers() {
  std::vector<std::pair<const LoadedPlugin*, LayerPlugin*>> out;
  std::vector<std::string> names;  // first directory wins for a name
  for (const auto& d : search_path()) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) continue;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(d, ec)) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::string fn = f.filename().string();
      const std::string prefix = "libshardplan_layer_";
      if (fn.rfind(prefix, 0) != 0 || f.extension() != ".so") continue;
      std::string name = fn.substr(prefix.size(), fn.size() - prefix.size() - 3);
      if (std::find(names.begin(), names.end(), name) != names.end()) continue;
      names.push_back(name);
      LayerPlugin* obj = layer(f.string());
      out.emplace_back(&load_file(f.string(), SP_PLUGIN_LAYER), obj);
    }
  }
  return out;
}

std::string framework_library_dir() {
  return fs::weakly_canonical(boost::dll::this_line_location().parent_path().string()).string();
}

std::string default_plugin_dir() {
  return (fs::path(framework_library_dir()) / SHARDPLAN_PLUGIN_RELDIR).string();
}

}  // namespace shardplan
