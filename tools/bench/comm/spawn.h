#pragma once
// Runs one series' worker processes and reads their protocol lines, making
// sure the run ends: the first process to fail takes the others down (a
// rank waiting for a dead peer would otherwise sit out its whole timeout),
// and so does silence longer than `silence_limit`.
#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace shardplan_bench {

struct Process {
  std::string label;              // "rank 1", "mpirun", ...: named in errors
  std::vector<std::string> argv;  // argv[0] is a path
};

struct SpawnResult {
  bool ok = false;
  std::string error;  // why not, one line
};

// All processes share one new process group (so mpirun's ranks go too) and
// one pipe as stdout; stderr is ours. `env` entries ("K=V") are added to
// their environment. on_line gets every complete stdout line.
SpawnResult run_processes(const std::vector<Process>& procs, const std::vector<std::string>& env,
                          std::chrono::milliseconds silence_limit,
                          const std::function<void(const std::string&)>& on_line);

// Set by SIGINT/SIGTERM: run_processes stops its processes and returns.
void install_interrupt_handler();
bool interrupted();

}  // namespace shardplan_bench
