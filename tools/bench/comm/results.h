#pragma once
// One series' rows, put together from every rank's report the way
// nccl-tests does: time is the mean over ranks of each rank's mean time per
// call; p50 and p99 are those of the slowest rank; #wrong is the sum over
// ranks. A mode counts as measured only when every rank measured it.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "protocol.h"
#include "series.h"

namespace shardplan_bench {

struct Row {
  Collective coll = Collective::AllReduce;
  uint64_t bytes = 0, count = 0;
  ModeResult out, in;
};

struct SeriesResult {
  Series series;
  bool ok = false;
  std::string error;
  std::vector<std::string> notes;
  std::vector<Row> rows;  // in the order measured
  double seconds = 0;
};

class Collector {
 public:
  explicit Collector(int ranks) : ranks_(ranks) {}
  void add(const RankRow& r);
  void done(int rank) { done_.push_back(rank); }
  bool all_done() const;
  // Rows every rank reported.
  std::vector<Row> rows() const;

 private:
  int ranks_;
  std::vector<std::pair<Collective, uint64_t>> order_;
  std::map<std::pair<Collective, uint64_t>, std::vector<RankRow>> by_key_;
  std::vector<int> done_;
};

}  // namespace shardplan_bench
