#include "shardplan/nn/kv_cache.h"

#include <ATen/ATen.h>

#include <string>

#include "shardplan/error.h"
#include "base/shape_text.h"

namespace shardplan {
namespace nn {

KVCache::KVCache(int64_t capacity) : capacity_(capacity) {
  if (capacity < 1) throw Error("KVCache: capacity must be at least 1 position, got " + std::to_string(capacity));
}

int64_t KVCache::bytes() const {
  if (!key_.defined()) return 0;
  return (key_.numel() + value_.numel()) * static_cast<int64_t>(key_.element_size());
}

std::pair<at::Tensor, at::Tensor> KVCache::append(const at::Tensor& key, const at::Tensor& value) {
  if (key.dim() != 3 || !key.sizes().equals(value.sizes()))
    throw Error("KVCache: key and value must both be [batch * heads, positions, head_dim], got " +
                shape_str(key.sizes()) + " and " + shape_str(value.sizes()));
  const int64_t n = key.size(1);
  if (length_ + n > capacity_)
    throw Error("KVCache: " + std::to_string(length_) + " cached + " + std::to_string(n) +
                " new positions exceed its capacity of " + std::to_string(capacity_) + " (the context)");
  if (!key_.defined()) {
    key_ = at::empty({key.size(0), capacity_, key.size(2)}, key.options());
    value_ = at::empty_like(key_);
  } else if (key.size(0) != key_.size(0) || key.size(2) != key_.size(2) || key.scalar_type() != key_.scalar_type()) {
    throw Error("KVCache: appending " + shape_str(key.sizes()) + " to a cache of [" +
                std::to_string(key_.size(0)) + ", " + std::to_string(capacity_) + ", " + std::to_string(key_.size(2)) +
                "]: batch * heads, head_dim and dtype must stay those of the first append");
  }
  key_.narrow(1, length_, n).copy_(key);
  value_.narrow(1, length_, n).copy_(value);
  length_ += n;
  return {this->key(), this->value()};
}

at::Tensor KVCache::key() const { return key_.defined() ? key_.narrow(1, 0, length_) : at::Tensor(); }
at::Tensor KVCache::value() const { return value_.defined() ? value_.narrow(1, 0, length_) : at::Tensor(); }

}  // namespace nn
}  // namespace shardplan
