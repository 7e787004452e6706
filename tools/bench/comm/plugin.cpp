#include "plugin.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "shardplan/abi/plugin.h"

#ifndef SHARDPLAN_BENCH_PLUGIN_RELDIR
#define SHARDPLAN_BENCH_PLUGIN_RELDIR "../lib/shardplan/plugins"
#endif

namespace shardplan_bench {

namespace fs = std::filesystem;

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return {};
  buf[n] = 0;
  return buf;
}

std::string self_dir() { return fs::path(self_exe()).parent_path().string(); }

std::vector<std::string> plugin_search_path(const std::vector<std::string>& extra) {
  std::vector<std::string> dirs(extra);
  if (const char* env = std::getenv("SHARDPLAN_PLUGIN_PATH")) {
    std::string s = env;
    for (size_t p = 0; p <= s.size();) {
      size_t q = s.find(':', p);
      if (q == std::string::npos) q = s.size();
      if (q > p) dirs.push_back(s.substr(p, q - p));
      p = q + 1;
    }
  }
  dirs.push_back((fs::path(self_dir()) / SHARDPLAN_BENCH_PLUGIN_RELDIR).lexically_normal().string());
  return dirs;
}

std::vector<PluginFile> find_comm_plugins(const std::vector<std::string>& dirs) {
  const std::string prefix = "libshardplan_comm_", suffix = ".so";
  std::vector<PluginFile> out;
  std::set<std::string> seen;
  for (const std::string& d : dirs) {
    std::error_code ec;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(d, ec)) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& p : files) {
      const std::string f = p.filename().string();
      if (f.size() <= prefix.size() + suffix.size() || f.compare(0, prefix.size(), prefix) != 0 ||
          f.compare(f.size() - suffix.size(), suffix.size(), suffix) != 0)
        continue;
      std::string name = f.substr(prefix.size(), f.size() - prefix.size() - suffix.size());
      if (seen.insert(name).second) out.push_back({name, fs::absolute(p).string()});
    }
  }
  return out;
}

const sp_comm_api* open_comm_plugin(const std::string& path) {
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) throw std::runtime_error(std::string("cannot load ") + ::dlerror());
  auto entry = reinterpret_cast<sp_plugin_entry_fn>(::dlsym(lib, SP_PLUGIN_ENTRY_SYMBOL));
  if (!entry) throw std::runtime_error(path + " has no " SP_PLUGIN_ENTRY_SYMBOL);
  const sp_plugin_info* info = entry();
  if (!info || info->entry_version != SP_PLUGIN_ENTRY_VERSION || info->kind != SP_PLUGIN_COMM ||
      info->abi_version != SP_COMM_ABI_VERSION)
    throw std::runtime_error(path + " is not a comm plugin of ABI version " + std::to_string(SP_COMM_ABI_VERSION));
  auto api = static_cast<const sp_comm_api*>(info->factory());
  if (!api || api->struct_size < sizeof(sp_comm_api))
    throw std::runtime_error(path + ": its function table is from an older ABI");
  return api;
}

}  // namespace shardplan_bench
