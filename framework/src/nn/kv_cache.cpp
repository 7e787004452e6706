#include "shardplan/nn/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>

#include "shardplan/error.h"
#include "base/shape_text.h"

namespace shardplan {
namespace nn {

KVCache::KVCache(int64_t capacity, int64_t window) : capacity_(capacity), window_(window < capacity ? window : 0) {
  if (capacity < 1) throw Error("KVCache: capacity must be at least 1 position, got " + std::to_string(capacity));
  if (window < 0) throw Error("KVCache: window must be 0 (none) or positive, got " + std::to_string(window));
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
    key_ = at::empty({key.size(0), window_ ? window_ : capacity_, key.size(2)}, key.options());
    value_ = at::empty_like(key_);
  } else if (key.size(0) != key_.size(0) || key.size(2) != key_.size(2) || key.scalar_type() != key_.scalar_type()) {
    throw Error("KVCache: appending " + shape_str(key.sizes()) + " to a cache of [" +
                std::to_string(key_.size(0)) + ", " + std::to_string(capacity_) + ", " + std::to_string(key_.size(2)) +
                "]: batch * heads, head_dim and dtype must stay those of the first append");
  }
  if (window_) return append_windowed(key, value);
  key_.narrow(1, length_, n).copy_(key);
  value_.narrow(1, length_, n).copy_(value);
  length_ += n;
  held_ = length_;
  return {this->key(), this->value()};
}

// The positions held and the new ones are returned whole: a prefill longer
// than the window still attends to each query's window among them.
std::pair<at::Tensor, at::Tensor> KVCache::append_windowed(const at::Tensor& key, const at::Tensor& value) {
  const at::Tensor k = held_ ? at::cat({this->key(), key}, 1) : key;
  const at::Tensor v = held_ ? at::cat({this->value(), value}, 1) : value;
  const int64_t keep = std::min(window_, k.size(1));
  key_.narrow(1, 0, keep).copy_(k.narrow(1, k.size(1) - keep, keep));
  value_.narrow(1, 0, keep).copy_(v.narrow(1, v.size(1) - keep, keep));
  length_ += key.size(1);
  held_ = keep;
  return {k, v};
}

at::Tensor KVCache::key() const { return key_.defined() ? key_.narrow(1, 0, held_) : at::Tensor(); }
at::Tensor KVCache::value() const { return value_.defined() ? value_.narrow(1, 0, held_) : at::Tensor(); }

}  // namespace nn
}  // namespace shardplan
