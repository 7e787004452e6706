// The replica check (replica_check.h): checksums all-gathered per axis, the
// first difference named, and the word passed along every axis so that every
// rank throws, whether its own group differs or not.
#include "replica_check.h"

#include <ATen/ATen.h>

#include <cstring>

#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"

namespace shardplan {
namespace {

// Replicas must be bit-identical, so any difference must change the sum.
// Each step is a bijection of a lane's running value for a given word (xor,
// odd multiply, xorshift), so one differing word always changes the result,
// and the xorshift carries high bits down so that two differences rarely
// cancel. Four independent lanes of 64-bit words: the check's cost is this
// loop, and one lane waits on its multiply's latency.
uint64_t mix(uint64_t h, uint64_t w) {
  h = (h ^ w) * 1099511628211ull;
  return h ^ (h >> 29);
}

int64_t checksum(const at::Tensor& t) {
  at::Tensor c = t.detach().contiguous().cpu();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
  uint64_t h[4] = {1469598103934665603ull, 1, 2, 3};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      h[k] = mix(h[k], w);
    }
  for (; i < n; ++i) h[0] = mix(h[0], p[i]);
  uint64_t all = h[0];
  for (int k = 1; k < 4; ++k) all = mix(all, h[k]);
  int64_t out;
  std::memcpy(&out, &all, sizeof out);
  return out;
}

// This rank's piece of `row` over `axis`: -1 when not split over it (a
// replica of every rank), the piece index for a `shared` split (a replica of
// the ranks holding the same piece), -2 for a plain split (nothing to compare).
int64_t piece_on(const ReportRow* row, const std::string& axis) {
  if (!row) return -1;
  for (const auto& s : row->splits)
    if (s.axis == axis) return s.shared > 1 ? s.index : -2;
  return -1;
}

std::string drift_causes() {
  return ". A drift usually comes from torch::nn::utils::clip_grad_norm_ on a rank's shards (each rank clips by "
         "the norm of its own shards: use shardplan::clip_grad_norm_, shardplan/clip_grad.h, which counts every "
         "element once), a rank-local random stream (draw from shardplan's RngTracker, shardplan/random.h), or a "
         "non-deterministic kernel";
}

}  // namespace

void check_replica_params(const std::vector<std::pair<std::string, at::Tensor>>& params,
                          const std::vector<const ReportRow*>& rows, const std::vector<ReplicaAxis>& axes) {
  // Every axis' exchange happens before any rank throws, so a rank that
  // finds a difference never leaves another waiting in a collective.
  std::string first;
  for (const ReplicaAxis& axis : axes) {
    const auto& group = axis.group;
    if (!group || group->size() == 1) continue;
    std::vector<size_t> compared;
    for (size_t i = 0; i < params.size(); ++i)
      if (piece_on(rows[i], axis.name) != -2 && !axis.skip.count(params[i].first)) compared.push_back(i);
    const int64_t m = static_cast<int64_t>(compared.size());
    // Checksums, then pieces; one more slot so that no rank sends nothing.
    at::Tensor mine = at::zeros({2 * m + 1}, at::kLong);
    for (int64_t k = 0; k < m; ++k) {
      mine[k] = checksum(params[compared[k]].second);
      mine[m + k] = piece_on(rows[compared[k]], axis.name);
    }
    at::Tensor all = group->all_gather(mine, 0).view({group->size(), mine.numel()});
    const auto a = all.accessor<int64_t, 2>();
    for (int64_t k = 0; k < m && first.empty(); ++k)
      for (int r = 1; r < group->size() && first.empty(); ++r) {
        int q = 0;  // the first rank holding what r holds
        while (q < r && a[q][m + k] != a[r][m + k]) ++q;
        if (q < r && a[r][k] != a[q][k])
          first = "replica check: parameter '" + params[compared[k]].first +
                  "' differs across the ranks of mesh axis '" + axis.name + "' (world rank " +
                  std::to_string(group->ranks()[r]) + " holds other values than world rank " +
                  std::to_string(group->ranks()[q]) + "): the replicas have drifted" + drift_causes();
      }
  }
  // Only the ranks of the group that differs saw it: pass the word along
  // every axis in turn (which reaches the whole mesh), so every rank throws.
  int me = -1;
  for (const ReplicaAxis& axis : axes)
    if (axis.group) me = axis.group->ranks()[axis.group->rank()];
  at::Tensor reporter = at::full({1}, first.empty() ? int64_t{0} : int64_t{me} + 1, at::kLong);
  for (const ReplicaAxis& axis : axes)
    if (axis.group && axis.group->size() > 1) axis.group->all_reduce(reporter, ReduceOp::Max);
  if (!first.empty()) throw Error(first);
  if (const int64_t r = reporter.item<int64_t>(); r > 0)
    throw Error("replica check: world rank " + std::to_string(r - 1) +
                " found a parameter that differs across its replicas (its error names it): the replicas have "
                "drifted" + drift_causes());
}

}  // namespace shardplan
