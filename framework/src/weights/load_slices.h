#pragma once
// Copying a weights file's tensor into part of this rank's shard: the whole
// shard (load_weights), or only the elements of it that this rank's ZeRO-3
// slice covers (load_weights with a DataParallel, load_slices.cpp), reading
// from the mapped file only the rows those elements lie in. Not installed.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "shardplan/split.h"
#include "shardplan/weights.h"
#include "weights/weights_internal.h"

namespace shardplan {

class DataParallel;

namespace weights_detail {

// Where a ZeRO-3 unit's parameter lives between uses: this rank's slice of
// its unit's bucket holds the bucket's flat elements [lo, lo + slice.numel()),
// and the parameter (its TP shard, flattened row-major) is the bucket's
// elements [offset, offset + numel).
struct SliceTarget {
  at::Tensor slice;
  int64_t offset = 0, numel = 0, lo = 0;
};
using SliceTargets = std::map<const void*, SliceTarget>;  // by the parameter's TensorImpl

// The slices of `dp`'s ZeRO-3 units (none below stage 3). Throws Error when
// its parameters are whole (a WholeParameters scope or a forward open):
// what it loaded into the slices would be overwritten. Drops the gathers
// prefetched of the old values.
SliceTargets slice_targets(DataParallel& dp);

// The rows [lo, hi) of dim 0 of the shard `splits` cut from `src` into
// `dst` (those rows' shape), as strided views of both: a later split of a
// dim an earlier blocked split cut cannot be read this way (views_express).
void copy_rows(at::Tensor dst, const at::Tensor& src, const std::vector<ShardSplit>& splits, int64_t lo, int64_t hi,
               bool is_bool);
bool views_express(const std::vector<ShardSplit>& splits);

// Copies into `where.slice` the elements of this rank's shard (shape
// `local`, cut from `s` by `splits`) that the slice covers; returns the
// bytes written. Reads only the shard rows they lie in, and needs at most
// two rows of memory beside the slice (a row the slice starts or ends in).
int64_t copy_into_slice(const SourceTensor& s, const std::vector<ShardSplit>& splits, at::IntArrayRef local,
                        const SliceTarget& where, bool whole_then_slice);

// load_weights (load.cpp), with the parameters in `slices` loaded into
// their slices instead of their tensors.
WeightsReport load_into(torch::nn::Module& model, const ParallelReport& report, const std::string& path,
                        const WeightsOptions& options, const SliceTargets& slices);

}  // namespace weights_detail
}  // namespace shardplan
