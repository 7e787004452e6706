#include "models/train_checks.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "shardplan/error.h"

namespace shardplan {
namespace examples {

void check_save_dir(const std::string& dir, const std::string& option) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path path(dir);
  const bool file = path.extension() == ".safetensors";
  if (!file && fs::exists(path, ec) && !fs::is_directory(path, ec))
    throw Error(option + " " + dir + ": exists and is not a directory");
  fs::path parent = path.parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, ec))
    throw Error(option + " " + dir + ": the directory it would be written in, " + parent.string() + ", does not exist");
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    throw Error(option + " " + dir + ": cannot write in " + parent.string() + " (it is written beside its target first)");
}

int64_t available_memory_bytes(std::string* source) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kib) == 1) {
      *source = "MemAvailable in /proc/meminfo";
      return static_cast<int64_t>(kib) * 1024;
    }
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), size = ::sysconf(_SC_PAGESIZE);
  if (pages < 0 || size < 0) return -1;
  *source = "sysconf(_SC_AVPHYS_PAGES)";
  return static_cast<int64_t>(pages) * size;
}

void check_memory(const std::string& option, const std::string& what, double per_rank, int ranks) {
  std::string source;
  const int64_t available = available_memory_bytes(&source);
  const double needed = per_rank * ranks;
  if (available < 0 || needed <= static_cast<double>(available)) return;
  std::ostringstream s;
  s.precision(0);
  s << std::fixed << option << ": " << what << " needs " << needed << " bytes on this machine (" << ranks
    << " rank(s) x " << per_rank << "), but " << available << " are available (" << source << ")";
  throw Error(s.str());
}

}  // namespace examples
}  // namespace shardplan
