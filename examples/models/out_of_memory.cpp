#include "models/out_of_memory.h"

#include <c10/util/Exception.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include "models/memory.h"
#include "shardplan/error.h"

namespace shardplan {
namespace examples {
namespace {

// VmData, the figure RLIMIT_DATA limits (bytes; -1 if unknown).
int64_t private_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmData:", 0) == 0) return std::strtoll(line.c_str() + 7, nullptr, 10) * 1024;
  return -1;
}

std::string data_limit() {
  rlimit l{};
  if (getrlimit(RLIMIT_DATA, &l) != 0 || l.rlim_cur == RLIM_INFINITY) return "no limit";
  return "its limit " + mib(static_cast<int64_t>(l.rlim_cur)) + " MiB";
}

}  // namespace

void throw_if_out_of_memory(const std::string& what, const std::exception& e) {
  std::string bytes;
  if (const auto* c10e = dynamic_cast<const c10::Error*>(&e)) {
    // libtorch 1.x "can't allocate memory", 2.x "not enough memory"; both
    // go on "you tried to allocate N bytes".
    const std::string msg = c10e->what_without_backtrace();
    const size_t at = msg.find("you tried to allocate ");
    if (at == std::string::npos) return;
    bytes = " its " + std::to_string(std::strtoll(msg.c_str() + at + 22, nullptr, 10)) + " bytes";
  } else if (!dynamic_cast<const std::bad_alloc*>(&e)) {
    return;
  }
  throw Error("out of memory giving " + what + bytes + ": this process holds " + mib(private_bytes()) +
              " MiB of private memory (" + data_limit() +
              "); shard more of the training state (data_parallel: {zero: 3}, recompute:, more ranks) or give "
              "each rank more memory");
}

}  // namespace examples
}  // namespace shardplan
