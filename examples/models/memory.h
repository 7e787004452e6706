#pragma once
// This process's resident memory as Linux reports it (/proc/self/status), for
// the Llama benchmark's per-rank figures (benchmarks/llama, docs/BENCHMARKS.md):
// what loading weights or generating costs in memory, not only in time.
// Ranks that are threads share one process, so with them these figures are
// the process's, all its ranks together.
#include <cstdint>
#include <functional>
#include <string>

namespace shardplan {

class World;

namespace examples {

struct ProcessMemory {
  int64_t rss = -1;   // VmRSS, bytes; -1 where /proc/self/status is not readable
  int64_t peak = -1;  // VmHWM: the most resident since the start or the last reset
};
ProcessMemory process_memory();

// Collective over `world`: resets the process's peak (once per process, by
// rank 0 when `ranks_in_process` > 1, via /proc/self/clear_refs), runs fn on
// every rank, waits for all of them and returns the memory then, so that its
// peak is the process's peak during fn. `reset` says whether the kernel took
// the reset (Linux >= 4.0); if not, the peak counts from the start.
ProcessMemory peak_during(World& world, int ranks_in_process, const std::function<void()>& fn,
                          bool* reset = nullptr);

// SHARDPLAN_REPORT_MEMORY=1: the example programs print these figures (a
// benchmark switch; the figures cost two barriers, so they are off by default).
bool memory_report_requested();

// "123.4" (MiB, one decimal), "?" when unknown.
std::string mib(int64_t bytes);

}  // namespace examples
}  // namespace shardplan
