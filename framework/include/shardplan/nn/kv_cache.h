#pragma once
// The key/value cache of one attention layer for incremental decoding
// (Megatron's inference key/value memory, HF's past_key_values): the keys and
// values of every position decoded so far, so that each new token attends to
// them without recomputing their projections.
//
// It holds what the layer's heads computed, after the q/k/v projection:
// [batch * heads, positions, head_dim]. Under head-parallel attention (the mha
// plugin) a rank computes only its own heads, so its cache holds only those:
// per-rank cache bytes are 1/N of the unsharded cache, sharded exactly like
// the attention weights, with no extra communication.
//
// Storage is allocated once, for `capacity` positions (the model's context),
// on the first append; appending past it throws shardplan::Error rather than
// growing, since the positions past the context have no embedding.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace shardplan {
namespace nn {

class KVCache {
 public:
  explicit KVCache(int64_t capacity);

  int64_t capacity() const { return capacity_; }
  int64_t length() const { return length_; }  // positions cached
  // Bytes of the key and value storage (0 before the first append).
  int64_t bytes() const;
  // Forgets the positions, keeps the storage (a new sequence of the same
  // batch and heads reuses it).
  void clear() { length_ = 0; }

  // Appends the keys and values of new positions, each [batch * heads, L,
  // head_dim] (the batch, heads, head_dim, dtype and device of the first
  // append), and returns every cached position's keys and values so far,
  // [batch * heads, length(), head_dim] (views of the storage).
  std::pair<at::Tensor, at::Tensor> append(const at::Tensor& key, const at::Tensor& value);

  // Views of the cached positions (undefined before the first append).
  at::Tensor key() const;
  at::Tensor value() const;

 private:
  int64_t capacity_;
  int64_t length_ = 0;
  at::Tensor key_, value_;  // [batch * heads, capacity, head_dim]
};

}  // namespace nn
}  // namespace shardplan
