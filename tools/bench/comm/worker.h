#pragma once
// A worker process: one series' ranks (all of them as threads, or the one
// rank this process is), each running the sweep and reporting on stdout.
#include "options.h"

namespace shardplan_bench {

// Exit status: 0 when every rank finished its sweep, 1 otherwise (the
// reason is on stderr).
int worker_main(const Options& options);

}  // namespace shardplan_bench
