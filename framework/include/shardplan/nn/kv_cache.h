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
//
// With a `window` (sliding-window attention, Mistral's sliding_window) it
// holds only the last `window` positions: storage for `window` of them, and
// positions still counted to `capacity`. Keys are cached after the rotary
// embedding, so the positions they were rotated for stay right.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace shardplan {
namespace nn {

class KVCache {
 public:
  explicit KVCache(int64_t capacity, int64_t window = 0);

  int64_t capacity() const { return capacity_; }
  int64_t window() const { return window_; }  // 0: none
  int64_t length() const { return length_; }  // positions appended so far
  int64_t held() const { return held_; }      // positions held: the last min(length, window)
  // Bytes of the key and value storage (0 before the first append).
  int64_t bytes() const;
  // Forgets the positions, keeps the storage (a new sequence of the same
  // batch and heads reuses it).
  void clear() { length_ = held_ = 0; }

  // Appends the keys and values of new positions, each [batch * heads, L,
  // head_dim] (the batch, heads, head_dim, dtype and device of the first
  // append), and returns every cached position's keys and values so far,
  // [batch * heads, length(), head_dim] (views of the storage). With a
  // window: the positions held before this append and the new ones, the
  // last held() of which it keeps.
  std::pair<at::Tensor, at::Tensor> append(const at::Tensor& key, const at::Tensor& value);

  // Views of the held positions (undefined before the first append).
  at::Tensor key() const;
  at::Tensor value() const;

 private:
  int64_t capacity_;
  int64_t window_;
  int64_t length_ = 0;
  int64_t held_ = 0;
  at::Tensor key_, value_;  // [batch * heads, capacity or window, head_dim]

  std::pair<at::Tensor, at::Tensor> append_windowed(const at::Tensor& key, const at::Tensor& value);
};

}  // namespace nn
}  // namespace shardplan
