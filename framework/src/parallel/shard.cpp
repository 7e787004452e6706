#include "shardplan/shard.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>

#include "nn/deferred_internal.h"
#include "shardplan/error.h"

namespace shardplan {

at::Tensor shard_of(const at::Tensor& full, int64_t dim, int64_t parts, int64_t index, int64_t blocks) {
  dim = at::maybe_wrap_dim(dim, full.dim());
  const int64_t n = full.size(dim);
  if (blocks < 1 || n % blocks != 0 || (n / blocks) % parts != 0)
    throw Error("cannot split dim " + std::to_string(dim) + " of size " + std::to_string(n) + " into " +
                std::to_string(parts) + " parts" +
                (blocks > 1 ? " per each of " + std::to_string(blocks) + " blocks" : std::string()));
  if (parts == 1) return full;
  const int64_t block = n / blocks, piece = block / parts;
  if (nn::detail::over_zero_page(full)) {  // DeferredInit: zeros, without a copy of them
    std::vector<int64_t> sizes = full.sizes().vec();
    sizes[dim] = blocks * piece;
    return nn::detail::zero_page_like(sizes, full.scalar_type());
  }
  if (blocks == 1) return full.narrow(dim, index * piece, piece).contiguous();
  std::vector<at::Tensor> pieces;
  for (int64_t b = 0; b < blocks; ++b) pieces.push_back(full.narrow(dim, b * block + index * piece, piece));
  return at::cat(pieces, dim).contiguous();
}

std::pair<int64_t, int64_t> shard_range(int64_t size, int64_t parts, int64_t index) {
  if (size < 0 || parts < 1 || index < 0 || index >= parts)
    throw Error("cannot take part " + std::to_string(index) + " of " + std::to_string(parts) + " of size " +
                std::to_string(size));
  const int64_t chunk = (size + parts - 1) / parts;
  const int64_t begin = std::min(size, index * chunk);
  return {begin, std::min(size, begin + chunk)};
}

at::Tensor take_split(const at::Tensor& full, const ShardSplit& s) {
  const int64_t n = full.size(s.dim);
  if (s.blocks < 1 || n % s.blocks != 0)
    throw Error("cannot read dim " + std::to_string(s.dim) + " of size " + std::to_string(n) + " as " +
                std::to_string(s.blocks) + " blocks");
  if (s.parts == 1) return full;
  const int64_t block = n / s.blocks;
  const auto range = shard_range(block, s.parts, s.index);
  const int64_t len = range.second - range.first;
  if (s.blocks == 1) return full.narrow(s.dim, range.first, len);
  std::vector<at::Tensor> pieces;
  for (int64_t b = 0; b < s.blocks; ++b) pieces.push_back(full.narrow(s.dim, b * block + range.first, len));
  return at::cat(pieces, s.dim);
}

void replace_parameter(torch::nn::Module& module, const std::string& name, const at::Tensor& value) {
  auto params = module.named_parameters(/*recurse=*/false);
  auto* p = params.find(name);
  if (!p || !p->defined()) throw Error("module has no parameter '" + name + "'");
  // Under no_grad the copy records no history, so it needs no detach() first
  // (a dispatch that cost as much as a third of the clone on small shards).
  at::NoGradGuard no_grad;
  // A deferred parameter's shard holds zeros no load wrote yet: it stays
  // without memory until load_weights gives it (or ZeRO-3 its slice) some.
  if (nn::detail::over_zero_page(*p)) return p->set_data(nn::detail::zero_page_like(value.sizes(), value.scalar_type()));
  p->set_data(value.clone());
}

}  // namespace shardplan
