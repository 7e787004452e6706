// Copying a file's tensor into this rank's shard, or into the part of it its
// ZeRO-3 slice covers (load_slices.h), and load_weights into a ZeRO-3
// DataParallel's slices (weights.h).
//
// A slice is a range of the unit's parameters flattened row-major one after
// another, so it covers of each parameter a flat range [first, last) of its
// TP shard: whole rows of dim 0, plus at most a partial row at either end.
// The whole rows are copied from the mapped file straight into the slice (a
// strided view of the file's rows onto a view of the slice); each partial
// row goes through a buffer of one row. No rank builds its whole shard.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <mutex>

#include "checkpoint/checkpoint_internal.h"
#include "data_parallel/data_parallel_impl.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/shard.h"
#include "weights/load_slices.h"

namespace shardplan {
namespace weights_detail {
namespace {

// Per split, the blocks of its range of the dim, recursively, so every copy
// is one strided view into another; along dim 0 only the blocks' rows that
// meet [lo, hi) of the shard being cut are visited.
void copy_rows_from(at::Tensor dst, const at::Tensor& src, const std::vector<ShardSplit>& splits, size_t i, int64_t lo,
                    int64_t hi, bool is_bool) {
  if (i == splits.size()) {
    const at::Tensor piece = src.dim() == 0 ? src : src.narrow(0, lo, hi - lo);
    dst.copy_(is_bool ? piece.ne(0) : piece);  // any nonzero byte is true, as in safetensors
    return;
  }
  const ShardSplit& s = splits[i];
  if (s.parts == 1) return copy_rows_from(dst, src, splits, i + 1, lo, hi, is_bool);
  const int64_t block = src.size(s.dim) / s.blocks;
  const auto r = shard_range(block, s.parts, s.index);
  const int64_t len = r.second - r.first;
  for (int64_t b = 0; b < s.blocks; ++b) {
    const at::Tensor from = src.narrow(s.dim, b * block + r.first, len);
    if (s.dim != 0) {
      copy_rows_from(dst.narrow(s.dim, b * len, len), from, splits, i + 1, lo, hi, is_bool);
      continue;
    }
    const int64_t a = std::max(lo, b * len), c = std::min(hi, (b + 1) * len);
    if (a < c) copy_rows_from(dst.narrow(0, a - lo, c - a), from, splits, i + 1, a - b * len, c - b * len, is_bool);
  }
}

// Elements [first, last) of the flattened shard (shape `local`) into `out`.
void copy_range(const at::Tensor& out, const at::Tensor& src, const std::vector<ShardSplit>& splits,
                at::IntArrayRef local, int64_t first, int64_t last, bool is_bool) {
  if (local.empty()) return copy_rows(out.view({}), src, splits, 0, 0, is_bool);
  int64_t row = 1;
  for (size_t d = 1; d < local.size(); ++d) row *= local[d];
  auto piece = [&](int64_t a, int64_t c) {
    const int64_t ra = a / row, rc = (c + row - 1) / row;
    std::vector<int64_t> shape(local.begin(), local.end());
    shape[0] = rc - ra;
    at::Tensor dst = out.narrow(0, a - first, c - a);
    if (a == ra * row && c == rc * row) return copy_rows(dst.view(shape), src, splits, ra, rc, is_bool);
    const at::Tensor rows = at::empty(shape, out.options());
    copy_rows(rows, src, splits, ra, rc, is_bool);
    dst.copy_(rows.view(-1).narrow(0, a - ra * row, c - a));
  };
  const int64_t up = (first + row - 1) / row * row, down = last / row * row;
  if (first < std::min(up, last)) piece(first, std::min(up, last));  // the end of a row
  if (up < down) piece(up, down);                                     // whole rows
  if (std::max(up, down) < last) piece(std::max(up, down), last);     // the start of a row
}

}  // namespace

void copy_rows(at::Tensor dst, const at::Tensor& src, const std::vector<ShardSplit>& splits, int64_t lo, int64_t hi,
               bool is_bool) {
  copy_rows_from(std::move(dst), src, splits, 0, lo, hi, is_bool);
}

bool views_express(const std::vector<ShardSplit>& splits) {
  for (size_t i = 0; i < splits.size(); ++i)
    for (size_t j = i + 1; j < splits.size(); ++j)
      if (splits[i].blocks > 1 && splits[i].parts > 1 && splits[j].dim == splits[i].dim) return false;
  return true;
}

int64_t copy_into_slice(const SourceTensor& s, const std::vector<ShardSplit>& splits, at::IntArrayRef local,
                        const SliceTarget& where, bool whole_then_slice) {
  const int64_t n = where.slice.numel();
  const int64_t begin = std::max(where.offset, where.lo), end = std::min(where.offset + where.numel, where.lo + n);
  if (begin >= end) return 0;
  const at::Tensor out = where.slice.narrow(0, begin - where.lo, end - begin);
  const int64_t first = begin - where.offset, last = end - where.offset;
  at::Tensor src = s.view();
  if (whole_then_slice || !views_express(splits)) {
    // The benchmarks' whole-tensor loader, and split orders no plugin makes:
    // the shard is built whole, then the slice's part of it is kept.
    if (s.is_bool) src = src.ne(0);
    const at::Tensor shard = ckpt_detail::take_splits(whole_then_slice ? src.clone() : src, splits);
    out.copy_(shard.reshape(-1).narrow(0, first, last - first));
  } else {
    copy_range(out, src, splits, local, first, last, s.is_bool);
  }
  s.file->drop(s.begin, s.end);
  return (end - begin) * static_cast<int64_t>(where.slice.element_size());
}

SliceTargets slice_targets(DataParallel& dp) {
  DataParallel::Impl& d = dp.impl();
  SliceTargets out;
  if (!d.stage3()) return out;
  std::lock_guard<std::mutex> lock(d.mu);
  bool whole = d.hold > 0;
  for (const auto& u : d.units) whole |= u.whole;
  if (whole)
    throw Error("load_weights into a ZeRO-3 DataParallel's slices while its parameters are whole (a "
                "DataParallel::WholeParameters scope or a forward is open): what the scope's end writes back would "
                "replace them; load outside the scope, or inside it with load_weights(model, report, path)");
  d.drop_prefetches();  // gathered from the slices' old values
  for (const auto& u : d.units) {
    const auto& b = d.buckets[u.bucket];
    const int64_t lo = d.rank * b.params.numel();
    for (size_t i : b.entries) {
      const auto& e = d.entries[i];
      out[e.param.unsafeGetTensorImpl()] = SliceTarget{b.params, e.offset, e.numel, lo};
    }
  }
  return out;
}

}  // namespace weights_detail

WeightsReport load_weights(DataParallel& dp, torch::nn::Module& model, const ParallelReport& report,
                           const std::string& path, const WeightsOptions& options) {
  return weights_detail::load_into(model, report, path, options, weights_detail::slice_targets(dp));
}

}  // namespace shardplan
