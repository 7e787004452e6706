#pragma once
// The measurement loop every rank of every series runs, like nccl-tests:
// per collective, buffers for the largest size, `warmup` untimed calls at
// that size; then per size and mode (out-of-place, in-place) an untimed call
// (the --check call, when checking), then `iters` timed calls back to back,
// each timed alone so percentiles exist. Rows go out as protocol lines.
#include "options.h"
#include "rank.h"

namespace shardplan_bench {

// Throws std::runtime_error (with the collective and size) on a failed call.
void run_sweep(Rank& rank, const SweepOptions& options);

}  // namespace shardplan_bench
