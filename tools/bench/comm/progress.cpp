#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "shardplan/comm_dtype.h"

namespace shardplan_bench {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string clock_text(double s) {
  char buf[32];
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

// Until a series has shown its own figures: a guess that errs long.
constexpr double kDefaultLatency = 100e-6;
constexpr double kDefaultBandwidth = 1e9;
}  // namespace

Progress::Progress(const Options& o, const std::vector<Series>& series)
    : o_(o), series_(series), tty_(::isatty(STDERR_FILENO) != 0) {
  const size_t es = shardplan::comm::dtype_size(o.sweep.dtype);
  for (const Series& s : series) {
    std::vector<Unit> units;
    for (Collective c : o.sweep.collectives) {
      if (s.reference() && c != Collective::AllReduce) continue;
      const size_t first = units.size();
      for (uint64_t b : o.sweep.sizes()) {
        Geometry g = geometry(c, b, es, o.ranks);
        if (!g.empty()) units.push_back({c, g.total * es, 0});
      }
      if (units.size() > first) units[first].warmup_bytes = units.back().bytes;
    }
    units_.push_back(units);
  }
  lat_.assign(series.size(), kDefaultLatency);
  bw_.assign(series.size(), kDefaultBandwidth);
  start_ = last_shown_ = Clock::now();
}

double Progress::predict(size_t s, const Unit& u) const {
  const int modes = u.coll == Collective::SendRecv ? 1 : 2;
  const double calls = modes * (o_.sweep.iters + 1.0);
  return calls * (lat_[s] + static_cast<double>(u.bytes) / bw_[s]) +
         o_.sweep.warmup * (lat_[s] + static_cast<double>(u.warmup_bytes) / bw_[s]);
}

double Progress::remaining() const {
  double left = 0, cur = 0;
  for (size_t k = done_units_; k < units_[cur_].size(); ++k) cur += predict(cur_, units_[cur_][k]);
  // The current series runs at the pace it has shown against the model.
  const double elapsed = since(series_start_);
  if (predicted_done_ > 0.5 && elapsed > 1) cur *= std::clamp(elapsed / predicted_done_, 0.2, 5.0);
  left += cur;
  for (size_t s = cur_ + 1; s < series_.size(); ++s) {
    // A later series is guessed from this one when they run alike.
    for (const Unit& u : units_[s]) left += predict(s, u);
  }
  return left;
}

void Progress::start_series(size_t index) {
  cur_ = index;
  done_units_ = 0;
  predicted_done_ = 0;
  have_small_ = false;
  largest_seen_ = 0;
  series_start_ = Clock::now();
  bytes_ = 0;
  show(true);
}

void Progress::at(Collective c, uint64_t bytes) {
  if (bytes_ != 0) {
    predicted_done_ += predict(cur_, units_[cur_][std::min(done_units_, units_[cur_].size() - 1)]);
    ++done_units_;
  }
  coll_ = c;
  bytes_ = bytes;
  show(false);
}

void Progress::row(const RankRow& r) {
  if (r.rank != 0 || !r.out.measured) return;
  const double t = r.out.mean_s;
  if (r.bytes <= 4096) {
    lat_[cur_] = have_small_ ? std::min(lat_[cur_], t) : t;
    have_small_ = true;
  } else if (r.bytes >= (64u << 10) && r.bytes >= largest_seen_ && t > lat_[cur_]) {
    // The largest size is the least disturbed by latency.
    bw_[cur_] = static_cast<double>(r.bytes) / (t - (have_small_ ? lat_[cur_] : 0));
    largest_seen_ = r.bytes;
  }
  // Series not started yet follow the latest calibration.
  for (size_t s = cur_ + 1; s < series_.size(); ++s) {
    lat_[s] = lat_[cur_];
    bw_[s] = bw_[cur_];
  }
}

void Progress::end_series(const SeriesResult& r) {
  char line[512];
  std::snprintf(line, sizeof line, "[%zu/%zu %s] %s in %.1f s%s%s", cur_ + 1, series_.size(),
                r.series.name.c_str(), r.ok ? "done" : "FAILED", since(series_start_), r.ok ? "" : ": ",
                r.ok ? "" : r.error.c_str());
  if (tty_) std::fprintf(stderr, "\r%-*s\n", static_cast<int>(last_width_), line);
  else std::fprintf(stderr, "%s\n", line);
  last_width_ = 0;
  std::fflush(stderr);
}

void Progress::message(const std::string& text) {
  if (tty_ && last_width_) std::fprintf(stderr, "\r%*s\r", static_cast<int>(last_width_), "");
  std::fprintf(stderr, "shardplan bench comm: %s\n", text.c_str());
  last_width_ = 0;
  std::fflush(stderr);
}

void Progress::finish() {
  std::fprintf(stderr, "shardplan bench comm: finished in %s\n", clock_text(since(start_)).c_str());
  std::fflush(stderr);
}

void Progress::show(bool force) {
  // On a terminal the line is redrawn in place; in a log, one line every
  // few seconds is enough.
  const double gap = since(last_shown_);
  if (!force && gap < (tty_ ? 0.2 : 5.0)) return;
  last_shown_ = Clock::now();
  char line[512];
  const size_t total = units_[cur_].size();
  if (bytes_ == 0)
    std::snprintf(line, sizeof line, "[%zu/%zu %s] starting %s  elapsed %s  ETA ~%s", cur_ + 1, series_.size(),
                  series_[cur_].name.c_str(), series_[cur_].describe(o_.ranks, true).c_str(),
                  clock_text(since(start_)).c_str(), clock_text(remaining()).c_str());
  else
    std::snprintf(line, sizeof line, "[%zu/%zu %s] %s %s (%zu/%zu)  elapsed %s  ETA ~%s", cur_ + 1, series_.size(),
                  series_[cur_].name.c_str(), collective_name(coll_), human_bytes(bytes_).c_str(), done_units_ + 1,
                  total, clock_text(since(start_)).c_str(), clock_text(remaining()).c_str());
  if (tty_) {
    const size_t w = std::string(line).size();
    std::fprintf(stderr, "\r%-*s", static_cast<int>(std::max(w, last_width_)), line);
    last_width_ = w;
  } else {
    std::fprintf(stderr, "%s\n", line);
  }
  std::fflush(stderr);
}

}  // namespace shardplan_bench
