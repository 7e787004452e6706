#include "results.h"

#include <algorithm>
#include <set>

namespace shardplan_bench {

void Collector::add(const RankRow& r) {
  const auto key = std::make_pair(r.coll, r.bytes);
  auto& v = by_key_[key];
  if (v.empty()) order_.push_back(key);
  v.push_back(r);
}

bool Collector::all_done() const { return std::set<int>(done_.begin(), done_.end()).size() == size_t(ranks_); }

namespace {
ModeResult combine(const std::vector<RankRow>& v, ModeResult RankRow::*mode) {
  ModeResult m;
  m.measured = true;
  m.wrong = 0;
  double sum = 0;
  for (const RankRow& r : v) {
    const ModeResult& x = r.*mode;
    if (!x.measured) return ModeResult{};
    sum += x.mean_s;
    m.p50_s = std::max(m.p50_s, x.p50_s);
    m.p99_s = std::max(m.p99_s, x.p99_s);
    if (x.wrong < 0 || m.wrong < 0) m.wrong = -1;
    else m.wrong += x.wrong;
  }
  m.mean_s = sum / static_cast<double>(v.size());
  return m;
}
}  // namespace

std::vector<Row> Collector::rows() const {
  std::vector<Row> out;
  for (const auto& key : order_) {
    const auto& v = by_key_.at(key);
    std::set<int> ranks;
    for (const RankRow& r : v) ranks.insert(r.rank);
    if (ranks.size() != size_t(ranks_)) continue;
    Row row;
    row.coll = key.first;
    row.bytes = key.second;
    row.count = v.front().count;
    row.out = combine(v, &RankRow::out);
    row.in = combine(v, &RankRow::in);
    out.push_back(row);
  }
  return out;
}

}  // namespace shardplan_bench
