#pragma once
// Finds and loads plugin libraries with Boost.DLL. A plugin named N of kind K
// is the file libshardplan_<K>_<N>.so (K: comm, layer), searched in order:
//   1. directories the plan lists under `plugins:`,
//   2. directories in $SHARDPLAN_PLUGIN_PATH (':'-separated),
//   3. the install directory: <dir of libshardplan.so>/shardplan/plugins
//      (the build tree mirrors this layout).
// Libraries stay loaded for the life of the process: strategies and autograd
// nodes created by a plugin may outlive any object that could own the handle.
#include <string>
#include <vector>

#include "shardplan/abi/comm.h"
#include "shardplan/abi/plugin.h"

namespace shardplan {

class LayerPlugin;

struct LoadedPlugin {
  std::string path;             // absolute path of the library
  const sp_plugin_info* info;   // checked: entry and kind ABI versions match
};

class PluginLoader {
 public:
  // The process-wide loader; extra directories are appended with add_dirs.
  static PluginLoader& instance();

  // Searched before $SHARDPLAN_PLUGIN_PATH and the install directory.
  void add_dirs(const std::vector<std::string>& dirs);
  std::vector<std::string> search_path() const;

  // Throws PluginError naming the file (or every directory searched) when the
  // file is missing, cannot be opened, lacks the entry symbol, or has another
  // entry/ABI version or kind.
  const LoadedPlugin& load(sp_plugin_kind kind, const std::string& name);
  const LoadedPlugin& load_file(const std::string& path, sp_plugin_kind expected_kind);

  const sp_comm_api* comm(const std::string& name);
  LayerPlugin* layer(const std::string& name);
  // Every layer plugin found on the search path (loaded on first call).
  std::vector<std::pair<const LoadedPlugin*, LayerPlugin*>> all_layers();

 private:
  PluginLoader() = default;
  struct Impl;
  Impl& impl();
};

// The directory holding libshardplan.so, found at run time.
std::string framework_library_dir();
// Default install-relative plugin directory: framework_library_dir()/shardplan/plugins.
std::string default_plugin_dir();

}  // namespace shardplan
