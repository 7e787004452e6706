#pragma once
// Progress on stderr while the bench runs: which series, collective and
// size, and an estimate of the time left. The estimate models a call as
// latency + bytes / bandwidth, both fitted per series from the rows seen so
// far, then scaled by how far the series' actual time is off the model.
#include <chrono>
#include <string>
#include <vector>

#include "options.h"
#include "results.h"
#include "series.h"

namespace shardplan_bench {

class Progress {
 public:
  Progress(const Options& o, const std::vector<Series>& series);
  void start_series(size_t index);
  void at(Collective c, uint64_t bytes);
  void row(const RankRow& r);  // rank 0's rows calibrate the model
  void end_series(const SeriesResult& r);
  // A line of its own, without garbling the progress line.
  void message(const std::string& text);
  void finish();

 private:
  struct Unit {
    Collective coll;
    uint64_t bytes;
    uint64_t warmup_bytes;  // the first size of a collective also pays its warm-up
  };
  double predict(size_t series, const Unit& u) const;
  double remaining() const;
  void show(bool force);

  const Options& o_;
  std::vector<Series> series_;
  std::vector<std::vector<Unit>> units_;
  std::vector<double> lat_, bw_;  // per series: seconds, bytes/second
  size_t cur_ = 0, done_units_ = 0;
  Collective coll_ = Collective::AllReduce;
  uint64_t bytes_ = 0;
  bool have_small_ = false;
  uint64_t largest_seen_ = 0;
  double predicted_done_ = 0;
  std::chrono::steady_clock::time_point start_, series_start_, last_shown_;
  bool tty_;
  size_t last_width_ = 0;
};

}  // namespace shardplan_bench
