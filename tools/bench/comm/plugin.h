#pragma once
// Finds and opens communication plugins without the framework (so the bench
// needs no libtorch): libshardplan_comm_<name>.so in --plugin-dir
// directories, then $SHARDPLAN_PLUGIN_PATH, then the plugin directory of the
// install (or build) tree this program belongs to, like the framework's
// PluginLoader.
#include <stdexcept>
#include <string>
#include <vector>

#include "shardplan/abi/comm.h"

namespace shardplan_bench {

struct PluginFile {
  std::string name;  // "gloo"
  std::string path;
};

std::vector<std::string> plugin_search_path(const std::vector<std::string>& extra_dirs);
// Every comm plugin on the search path, the first file of each name.
std::vector<PluginFile> find_comm_plugins(const std::vector<std::string>& dirs);

// dlopen()s the library (kept loaded) and checks its entry and ABI versions.
// Throws std::runtime_error naming the file.
const sp_comm_api* open_comm_plugin(const std::string& path);

// The directory of the running executable.
std::string self_dir();
std::string self_exe();

}  // namespace shardplan_bench
