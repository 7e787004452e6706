#pragma once
// Summaries of per-call times. Percentiles are nearest-rank on the sorted
// samples, so p99 of 20 calls is the slowest call: with few iterations it
// shows the worst case rather than an interpolation nobody measured.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <vector>

namespace shardplan_bench {

inline double mean_of(const std::vector<double>& v) {
  return v.empty() ? NAN : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// p in [0, 1]; the median for p = 0.5.
inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

inline double median_of(std::vector<double> v) { return percentile(std::move(v), 0.5); }

}  // namespace shardplan_bench
