#pragma once
// The results as nccl-tests style tables (stdout), CSV and JSON. The columns
// of the CSV and the keys of a JSON row are the same and are documented in
// docs/BENCHMARKS.md; tests/bench.cmake checks them.
#include <cstdio>
#include <string>
#include <vector>

#include "options.h"
#include "results.h"

namespace shardplan_bench {

struct RunInfo {
  std::string date;     // UTC, ISO 8601
  std::string host;     // "vm: 2 CPUs (AMD EPYC ...), Linux 6.1"
  std::string version;  // shardplan's
  double seconds = 0;
};

RunInfo describe_run(double seconds);

// The CSV header / JSON row keys, in order.
const std::vector<std::string>& row_columns();

// Derived figures of a measured mode (nccl-tests: GB = 1e9 bytes).
double algbw_gbps(uint64_t bytes, const ModeResult& m);
double busbw_gbps(Collective c, int ranks, uint64_t bytes, const ModeResult& m);

void print_tables(FILE* out, const Options& o, const RunInfo& info, const std::vector<SeriesResult>& results,
                  const std::vector<Unavailable>& unavailable);
// Throw std::runtime_error when the file cannot be written.
void write_csv(const std::string& path, const Options& o, const std::vector<SeriesResult>& results);
void write_json(const std::string& path, const Options& o, const RunInfo& info,
                const std::vector<SeriesResult>& results, const std::vector<Unavailable>& unavailable);

}  // namespace shardplan_bench
