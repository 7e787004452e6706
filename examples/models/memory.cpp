#include "models/memory.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "shardplan/error.h"
#include "shardplan/world.h"

namespace shardplan {
namespace examples {

ProcessMemory process_memory() {
  ProcessMemory m;
  std::ifstream in("/proc/self/status");
  std::string line;
  // Lines such as "VmHWM:\t  123456 kB".
  while (std::getline(in, line)) {
    int64_t* field = line.rfind("VmRSS:", 0) == 0 ? &m.rss : line.rfind("VmHWM:", 0) == 0 ? &m.peak : nullptr;
    if (field) *field = std::strtoll(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return m;
}

ProcessMemory peak_during(World& world, int ranks_in_process, const std::function<void()>& fn, bool* reset) {
  // The barriers keep a thread rank from resetting the peak while another
  // is already inside fn, and from reading it before the others are done.
  world.comm().barrier();
  bool ok = true;
  if (ranks_in_process <= 1 || world.rank() == 0) {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";  // 5: reset the peak resident set size (proc(5))
    clear.flush();
    ok = static_cast<bool>(clear);
  }
  if (reset) *reset = ok;
  world.comm().barrier();
  fn();
  world.comm().barrier();
  return process_memory();
}

bool memory_report_requested() {
  const char* env = std::getenv("SHARDPLAN_REPORT_MEMORY");
  if (!env || !*env || std::strcmp(env, "0") == 0) return false;
  if (std::strcmp(env, "1") != 0)
    throw Error(std::string("SHARDPLAN_REPORT_MEMORY='") + env + "' is not one of: 0, 1");
  return true;
}

std::string mib(int64_t bytes) {
  if (bytes < 0) return "?";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace examples
}  // namespace shardplan
