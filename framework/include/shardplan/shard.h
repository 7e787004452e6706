#pragma once
// Slicing a full tensor into this rank's shard, the one operation every layer
// plugin needs (and checkpoint resharding later).
#include <ATen/core/Tensor.h>

#include <string>

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

// Gives the parameter `name` of `module` the values (and shape) of `value`,
// keeping the parameter object itself, so references held by the module's
// typed members stay valid.
void replace_parameter(torch::nn::Module& module, const std::string& name, const at::Tensor& value);

}  // namespace shardplan
