#pragma once
// Slicing a full tensor into this rank's shard, the one operation every layer
// plugin needs (and checkpoint resharding later).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>

#include "shardplan/split.h"

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace shardplan {

// The part of `full` that `index` of `parts` owns along `dim`. With blocks = k
// the dim is read as k stacked blocks (fused q/k/v, LSTM gates) and each block
// is split, so the shard holds the index-th piece of every block, in block
// order. May share memory with `full`. Throws shardplan::Error when the sizes
// do not divide.
at::Tensor shard_of(const at::Tensor& full, int64_t dim, int64_t parts, int64_t index, int64_t blocks = 1);

// The [begin, end) of `size` that `index` of `parts` owns when `size` need not
// divide: ceil-division chunks as torch.chunk and Megatron's vocab split, so
// part r owns [r*c, min(size, (r+1)*c)) with c = ceil(size/parts); the last
// parts are smaller and may be empty (size 10 over 4: 3, 3, 3, 1; size 5
// over 4: 2, 2, 1, 0). Equals shard_of's split when `size` divides.
std::pair<int64_t, int64_t> shard_range(int64_t size, int64_t parts, int64_t index);

// The piece `s` describes; shard_of when the block size divides, otherwise
// shard_range's uneven chunks. Shares memory with `full` when blocks == 1.
at::Tensor take_split(const at::Tensor& full, const ShardSplit& s);

// Gives the parameter `name` of `module` the values (and shape) of `value`,
// keeping the parameter object itself, so references held by the module's
// typed members stay valid.
void replace_parameter(torch::nn::Module& module, const std::string& name, const at::Tensor& value);

}  // namespace shardplan
