#include "shardplan/helpers.h"

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>

#include <cmath>
#include <mutex>
#include <unordered_map>

#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/shard.h"
#include "base/shape_text.h"

namespace shardplan {

namespace {

ShardSplit wrapped(ShardSplit s, int64_t rank) {
  if (rank == 0) throw Error("cannot slice a scalar (0-dim tensor)");
  if (s.dim < -rank || s.dim >= rank)
    throw Error("dim " + std::to_string(s.dim) + " is out of range for a tensor of " + std::to_string(rank) +
                " dims");
  if (s.dim < 0) s.dim += rank;
  if (s.parts < 1 || s.index < 0 || s.index >= s.parts)
    throw Error("cannot take part " + std::to_string(s.index) + " of " + std::to_string(s.parts));
  return s;
}

// splitmix64's finaliser: consecutive counters give independent-looking bits.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Uniform in (0, 1]: never 0, so log() in Box-Muller stays finite.
double unit(uint64_t seed, uint64_t counter) {
  return static_cast<double>((mix(seed ^ mix(counter)) >> 11) + 1) * 0x1.0p-53;
}

double value_at(const CounterInit& init, uint64_t i) {
  if (init.kind == CounterInit::Kind::kUniform) return init.a + (init.b - init.a) * unit(init.seed, i);
  const double u1 = unit(init.seed, 2 * i), u2 = unit(init.seed, 2 * i + 1);
  return init.a + init.b * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// fan_in and fan_out as torch.nn.init computes them.
std::pair<double, double> fans(const std::vector<int64_t>& shape, const char* who) {
  if (shape.size() < 2)
    throw Error(std::string(who) + " needs a tensor of at least 2 dims, got shape " + shape_str(shape));
  double receptive = 1;
  for (size_t d = 2; d < shape.size(); ++d) receptive *= static_cast<double>(shape[d]);
  return {static_cast<double>(shape[1]) * receptive, static_cast<double>(shape[0]) * receptive};
}

// Row-major index in the full tensor of every element of the piece.
at::Tensor full_indices(const std::vector<int64_t>& full_shape, const ShardSplit& s) {
  const int64_t rank = static_cast<int64_t>(full_shape.size());
  auto i64 = at::TensorOptions().dtype(at::kLong);
  at::Tensor idx;
  int64_t stride = 1;
  for (int64_t d = rank - 1; d >= 0; --d) {
    at::Tensor pos = at::arange(full_shape[static_cast<size_t>(d)], i64);
    if (d == s.dim) {
      ShardSplit along = s;
      along.dim = 0;
      pos = take_split(pos, along);
    }
    std::vector<int64_t> view(static_cast<size_t>(rank), 1);
    view[static_cast<size_t>(d)] = pos.numel();
    at::Tensor term = pos.mul(stride).view(view);
    idx = idx.defined() ? idx + term : term;
    stride *= full_shape[static_cast<size_t>(d)];
  }
  return idx.contiguous();
}

void check_piece(const at::Tensor& shard, const std::vector<int64_t>& full_shape, const ShardSplit& s) {
  std::vector<int64_t> want = full_shape;
  const int64_t n = full_shape[static_cast<size_t>(s.dim)];
  if (s.blocks < 1 || n % s.blocks != 0)
    throw Error("cannot read dim " + std::to_string(s.dim) + " of size " + std::to_string(n) + " as " +
                std::to_string(s.blocks) + " blocks");
  const auto range = shard_range(n / s.blocks, s.parts, s.index);
  want[static_cast<size_t>(s.dim)] = (range.second - range.first) * s.blocks;
  if (shard.sizes().vec() != want)
    throw Error("shard_init_: the shard has shape " + shape_str(shard.sizes()) + ", but part " +
                std::to_string(s.index) + " of " + std::to_string(s.parts) + " along dim " + std::to_string(s.dim) +
                " of " + shape_str(full_shape) + " has shape " + shape_str(want));
}

// Declared splits by tensor. The weak reference tells a live entry from one
// whose tensor is gone (and whose address a new tensor may reuse).
using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
struct Declared {
  WeakImpl tensor;
  ShardSplit split;
};
std::mutex& declared_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<const c10::TensorImpl*, Declared>& declared_registry() {
  static auto* r = new std::unordered_map<const c10::TensorImpl*, Declared>();
  return *r;
}

}  // namespace

at::Tensor slice(const at::Tensor& full, int64_t dim, int64_t parts, int64_t index, int64_t blocks) {
  ShardSplit s = wrapped({dim, "", parts, index, blocks}, full.dim());
  return take_split(full, s).clone(at::MemoryFormat::Contiguous);
}

at::Tensor slice(const at::Tensor& full, int64_t dim, const Communicator& group, int64_t blocks) {
  return slice(full, dim, group.size(), group.rank(), blocks);
}

CounterInit uniform_init(uint64_t seed, double low, double high) {
  if (!(low <= high)) throw Error("uniform_init: low " + std::to_string(low) + " > high " + std::to_string(high));
  return {CounterInit::Kind::kUniform, seed, low, high};
}

CounterInit normal_init(uint64_t seed, double mean, double std) {
  if (!(std >= 0)) throw Error("normal_init: standard deviation " + std::to_string(std) + " < 0");
  return {CounterInit::Kind::kNormal, seed, mean, std};
}

CounterInit kaiming_uniform_init(uint64_t seed, const std::vector<int64_t>& full_shape, double a) {
  // torch.nn.init.kaiming_uniform_, mode fan_in, leaky_relu: gain sqrt(2 / (1 + a^2)).
  const double fan_in = fans(full_shape, "kaiming_uniform_init").first;
  const double bound = std::sqrt(2.0 / (1.0 + a * a)) * std::sqrt(3.0 / fan_in);
  return uniform_init(seed, -bound, bound);
}

CounterInit xavier_uniform_init(uint64_t seed, const std::vector<int64_t>& full_shape, double gain) {
  const auto f = fans(full_shape, "xavier_uniform_init");
  const double bound = gain * std::sqrt(6.0 / (f.first + f.second));
  return uniform_init(seed, -bound, bound);
}

void shard_init_(at::Tensor& shard, const std::vector<int64_t>& full_shape, const ShardSplit& split,
                 const CounterInit& init) {
  const ShardSplit s = wrapped(split, static_cast<int64_t>(full_shape.size()));
  check_piece(shard, full_shape, s);
  at::Tensor idx = full_indices(full_shape, s);
  at::Tensor values = at::empty(idx.sizes(), at::TensorOptions().dtype(at::kDouble));
  const int64_t* in = idx.data_ptr<int64_t>();
  double* out = values.data_ptr<double>();
  for (int64_t i = 0, n = idx.numel(); i < n; ++i) out[i] = value_at(init, static_cast<uint64_t>(in[i]));
  at::NoGradGuard no_grad;
  shard.copy_(values);
}

void shard_init_(at::Tensor& shard, const std::vector<int64_t>& full_shape, const ShardSplit& split,
                 const std::function<void(at::Tensor&)>& init) {
  const ShardSplit s = wrapped(split, static_cast<int64_t>(full_shape.size()));
  check_piece(shard, full_shape, s);
  at::NoGradGuard no_grad;
  at::Tensor full = at::empty(full_shape, shard.options().requires_grad(false));
  init(full);
  shard.copy_(take_split(full, s));
}

void register_parallel_split(const at::Tensor& param, const ShardSplit& split) {
  if (!param.defined()) throw Error("register_parallel_dim: the tensor is undefined");
  const ShardSplit s = wrapped(split, param.dim());
  std::lock_guard<std::mutex> lock(declared_mutex());
  auto& r = declared_registry();
  // Drop entries of tensors that are gone whenever the table has doubled.
  static size_t sweep_at = 64;
  if (r.size() >= sweep_at) {
    for (auto it = r.begin(); it != r.end();) it = it->second.tensor.expired() ? r.erase(it) : std::next(it);
    sweep_at = std::max<size_t>(64, 2 * r.size());
  }
  r.erase(param.unsafeGetTensorImpl());
  r.emplace(param.unsafeGetTensorImpl(), Declared{WeakImpl(param.getIntrusivePtr()), s});
}

void register_parallel_dim(const at::Tensor& param, int64_t dim, const std::string& axis) {
  register_parallel_split(param, ShardSplit{dim, axis, 1, 0, 1});
}

std::optional<ShardSplit> get_parallel_split(const at::Tensor& param) {
  if (!param.defined()) return std::nullopt;
  std::lock_guard<std::mutex> lock(declared_mutex());
  auto& r = declared_registry();
  auto it = r.find(param.unsafeGetTensorImpl());
  if (it == r.end()) return std::nullopt;
  if (it->second.tensor.lock().get() != param.unsafeGetTensorImpl()) {
    r.erase(it);
    return std::nullopt;
  }
  return it->second.split;
}

std::optional<int64_t> get_parallel_dim(const at::Tensor& param) {
  auto s = get_parallel_split(param);
  if (!s) return std::nullopt;
  return s->dim;
}

std::optional<int64_t> get_parallel_dim(const ParallelReport& report, const std::string& path) {
  for (const ReportRow& row : report.rows) {
    if (row.path != path) continue;
    if (row.splits.empty()) return std::nullopt;
    return row.splits.front().dim;
  }
  throw Error("get_parallel_dim: the plan's report has no parameter '" + path + "'");
}

}  // namespace shardplan
