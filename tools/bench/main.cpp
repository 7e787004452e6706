// shardplan-bench: the benchmark suites behind `shardplan bench` (which execs
// this program from its own directory). A separate executable so that the
// `shardplan` tool stays small and starts instantly.
#include <cstdio>
#include <cstring>

#include "comm/comm_main.h"

namespace {

const char* const kUsage =
    "usage: shardplan bench <suite> [options]\n"
    "\n"
    "suites:\n"
    "  comm   every communication backend on every collective, side by side\n"
    "\n"
    "Run 'shardplan bench <suite> --help' for the options of a suite.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "comm") == 0) return shardplan_bench::comm_main(argc - 1, argv + 1);
  std::fprintf(stderr, "shardplan bench: unknown suite '%s' (try --help)\n", argv[1]);
  return 2;
}
