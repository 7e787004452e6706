#pragma once
// --plot: busbw and p50 latency against size (log-log), one row of panels
// per collective, one line per series (references thin, with open points),
// drawn by gnuplot from a script written with the data inline.
#include <string>
#include <vector>

#include "options.h"
#include "results.h"

namespace shardplan_bench {

// Throws std::runtime_error when gnuplot is missing or fails.
void plot_png(const std::string& png, const Options& o, const std::vector<SeriesResult>& results);

// The message for a missing gnuplot; checked before anything runs.
std::string gnuplot_missing_message();

}  // namespace shardplan_bench
