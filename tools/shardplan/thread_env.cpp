#include "thread_env.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace shardplan_cli {

std::vector<std::pair<std::string, std::string>> thread_environment(int ranks_per_node) {
  std::string threads;
  if (const char* v = std::getenv("SHARDPLAN_NUM_THREADS"); v && *v) {
    threads = v;  // the ranks check it (shardplan/threads.h)
  } else {
    // The launcher's affinity is what its children inherit.
    cpu_set_t set;
    CPU_ZERO(&set);
    int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
    if (cores <= 0) cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::to_string(std::max(1, cores / std::max(1, ranks_per_node)));
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* name : {"SHARDPLAN_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"})
    if (!std::getenv(name)) out.emplace_back(name, threads);
  return out;
}

}  // namespace shardplan_cli
