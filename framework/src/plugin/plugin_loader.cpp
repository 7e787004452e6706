#include "shardplan/plugin_loader.h"

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "base/env.h"
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

// A library's static initialisers run inside dlopen, and its entry and
// factory are its code too. One that calls exit() there would end the
// program with the status it chose, and exit(0) reads as a successful run
// to a launcher or a script. While such code runs, `t_running_plugin` names
// the library on the loading thread, and a handler registered with atexit
// (and at_quick_exit) before the first load turns an exit on that thread
// into status 1 naming it; thread-local, so another thread ending the
// program meanwhile keeps its status. Handlers run in reverse order of
// registration: the library's own run first, ours before those of
// everything loaded earlier (libtorch, the C runtime's). _exit(0) cannot be
// intercepted in-process; it is documented as beyond this check.
thread_local const std::string* t_running_plugin = nullptr;

void exit_guard() {
  if (const std::string* path = t_running_plugin) {
    std::fprintf(stderr, "shardplan: plugin %s called exit() while being loaded; the process fails with status 1\n",
                 path->c_str());
    std::fflush(nullptr);
    ::_exit(1);
  }
}

class RunningPlugin {
 public:
  explicit RunningPlugin(const std::string& path) {
    static std::once_flag registered;
    std::call_once(registered, [] {
      std::atexit(exit_guard);
      std::at_quick_exit(exit_guard);
    });
    previous_ = t_running_plugin;
    t_running_plugin = &path;
  }
  ~RunningPlugin() { t_running_plugin = previous_; }
  RunningPlugin(const RunningPlugin&) = delete;
  RunningPlugin& operator=(const RunningPlugin&) = delete;

 private:
  const std::string* previous_;
};

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

void PluginLoader::add_plan_dirs(const std::vector<std::string>& dirs, const std::vector<SourceLoc>& locs) {
  auto loc = [&](size_t i) { return i < locs.size() ? locs[i] : SourceLoc{"<plan>", 0, 0}; };
  if (dirs.empty()) return;
  bool opt_in = false;
  try {
    opt_in = env::choice(kPlanPluginsEnv, {"0", "1"}, "0") == "1";
  } catch (const Error& e) {  // "yes" must not read as "no" silently
    throw PlanError(loc(0), e.what());
  }
  for (size_t i = 0; i < dirs.size(); ++i) {
    if (!opt_in)
      throw PlanError(loc(i), std::string("the plan names plugin directory '") + dirs[i] +
                                  "', which is searched only with " + kPlanPluginsEnv +
                                  "=1 (plugins run code when loaded; or add it to SHARDPLAN_PLUGIN_PATH)");
    std::error_code ec;
    if (!fs::is_directory(dirs[i], ec))
      throw PlanError(loc(i), "plugin directory '" + dirs[i] + "' does not exist or is not a directory");
  }
  add_dirs(dirs);
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

  RunningPlugin running(path);
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
  if (!is_plugin_name(name))
    throw PluginError(std::string("'") + name + "' is not a " + kind_name(kind) +
                      " plugin name (letters, digits, '_', '-', '.'): plugins are found by name in the plugin "
                      "directories, never by path; put the library's folder in SHARDPLAN_PLUGIN_PATH");
  std::string file = std::string("libshardplan_") + kind_name(kind) + "_" + name + ".so";
  auto dirs = search_path();
  for (const auto& d : dirs) {
    fs::path p = fs::path(d) / file;
    if (fs::exists(p)) return load_file(p.string(), kind);
  }
  std::string searched;
  for (const auto& d : dirs) searched += (searched.empty() ? "" : ", ") + d;
  throw PluginError(std::string("no ") + kind_name(kind) + " plugin '" + name + "': " + file +
                    " not found in [" + searched + "] (set SHARDPLAN_PLUGIN_PATH, or the plan's plugins: with " +
                    kPlanPluginsEnv + "=1)");
}

const sp_comm_api* PluginLoader::comm(const std::string& name) {
  const LoadedPlugin& p = load(SP_PLUGIN_COMM, name);
  const sp_comm_api* api = nullptr;
  {
    RunningPlugin running(p.path);
    api = static_cast<const sp_comm_api*>(p.info->factory());
  }
  if (!api || api->abi_version != SP_COMM_ABI_VERSION || api->struct_size < sizeof(sp_comm_api))
    throw PluginError(p.path + ": comm plugin returned an incompatible function table");
  return api;
}

LayerPlugin* PluginLoader::layer(const std::string& name) { return layer_object(load(SP_PLUGIN_LAYER, name)); }

LayerPlugin* PluginLoader::layer_object(const LoadedPlugin& p) {
  auto& m = impl();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.layer_objects.find(p.path);
  if (it != m.layer_objects.end()) return it->second;
  LayerPlugin* obj = nullptr;
  {
    RunningPlugin running(p.path);
    obj = static_cast<LayerPlugin*>(const_cast<void*>(p.info->factory()));
  }
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
      const LoadedPlugin& p = load_file(f.string(), SP_PLUGIN_LAYER);
      out.emplace_back(&p, layer_object(p));
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
