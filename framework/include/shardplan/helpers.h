#pragma once
// In-code helpers for users who shard by hand, in torchshard's style
// (docs/HELPERS.md): this rank's slice of a tensor, initialising a shard
// exactly as the full tensor would have been initialised and then sliced,
// and a parameter's parallel dim, declared or read back.
//
// Slices follow the plan's convention (shard.h): ceil-division chunks, so
// uneven sizes work (10 over 4: 3, 3, 3, 1), and `blocks` stacked blocks
// (fused q/k/v, LSTM gates) are each cut alike.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shardplan/split.h"

namespace shardplan {

class Communicator;
struct ParallelReport;

// ----------------------------------------------------------------- slicing

// The part of `full` that `index` of `parts` owns along `dim` (negative dims
// count from the end), as a contiguous tensor of its own (no memory shared
// with `full`, so the full tensor can be freed).
at::Tensor slice(const at::Tensor& full, int64_t dim, int64_t parts, int64_t index, int64_t blocks = 1);
// The same for this rank of `group` (e.g. world.group(mesh, "model")).
at::Tensor slice(const at::Tensor& full, int64_t dim, const Communicator& group, int64_t blocks = 1);

// ---------------------------------------------------------- initialisation

// A counter-based initialiser: element i (row-major index in the full
// tensor) gets a value computed from (seed, i) alone, so every shard fills
// itself without the full tensor existing anywhere, and any sharding of one
// seed gives the same full tensor. Values are float64 before the cast to the
// shard's dtype.
struct CounterInit {
  enum class Kind { kUniform, kNormal };
  Kind kind = Kind::kNormal;
  uint64_t seed = 0;
  double a = 0.0;  // uniform: low; normal: mean
  double b = 1.0;  // uniform: high; normal: standard deviation
};
CounterInit uniform_init(uint64_t seed, double low, double high);
CounterInit normal_init(uint64_t seed, double mean, double std);
// torch.nn.init's fan-based bounds, computed from the FULL shape (a shard's
// own fan would give another bound): kaiming_uniform_ as torch::nn::Linear
// and Conv initialise their weights (a = sqrt(5)), and xavier_uniform_.
CounterInit kaiming_uniform_init(uint64_t seed, const std::vector<int64_t>& full_shape, double a = 2.23606797749979);
CounterInit xavier_uniform_init(uint64_t seed, const std::vector<int64_t>& full_shape, double gain = 1.0);

// Fills `shard`, the piece `split` describes of a tensor of `full_shape`,
// with the values the full tensor gets from `init`. Never builds the full
// tensor. Throws shardplan::Error when shard's shape is not that piece's.
void shard_init_(at::Tensor& shard, const std::vector<int64_t>& full_shape, const ShardSplit& split,
                 const CounterInit& init);
// The same with any in-place initialiser of a full tensor (torch::nn::init's,
// which draw from torch's one sequential generator): the full tensor is made
// once in the shard's dtype, initialised, sliced and freed. Seed the
// generator alike (torch::manual_seed) in the sharded and unsharded runs and
// both start from the same weights.
void shard_init_(at::Tensor& shard, const std::vector<int64_t>& full_shape, const ShardSplit& split,
                 const std::function<void(at::Tensor&)>& init);

// ------------------------------------------------------------ parallel dim

// Declares that `param` holds a piece of a larger tensor cut along
// split.dim over mesh axis split.axis (torchshard's register_parallel_dim).
// parallelize() declares every parameter a plan cuts. The declaration
// lives as long as the tensor does; declaring again replaces it.
void register_parallel_split(const at::Tensor& param, const ShardSplit& split);
void register_parallel_dim(const at::Tensor& param, int64_t dim, const std::string& axis = "model");
// The declared split / dim, or nothing for a tensor that is whole
// (torchshard's get_parallel_dim returns None there).
std::optional<ShardSplit> get_parallel_split(const at::Tensor& param);
std::optional<int64_t> get_parallel_dim(const at::Tensor& param);
// The same read from a plan's report by parameter path ("fc1.weight"); a
// parameter cut over several axes gives its first cut. Throws
// shardplan::Error for a path the report does not list.
std::optional<int64_t> get_parallel_dim(const ParallelReport& report, const std::string& path);

}  // namespace shardplan
