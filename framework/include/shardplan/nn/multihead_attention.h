#pragma once
// shardplan::nn::MultiheadAttention: torch::nn::MultiheadAttention with a
// seam for parallelism. Same options (torch::nn::MultiheadAttentionOptions),
// parameter names (in_proj_weight or q/k/v_proj_weight, in_proj_bias,
// bias_k, bias_v, out_proj.weight, out_proj.bias), initialisation, state_dict
// keys and forward signature (sequence first: [L, N, E]), so a vanilla
// checkpoint loads into it and back, and unsharded it computes what torch's
// does with the same ATen calls in the same order (bit-identical).
//
// Where libtorch's C++ module is broken it follows PyTorch's Python module
// instead of failing or silently misbehaving:
//  - a bool attn_mask masks out the positions that are true (libtorch 1.13
//    adds it to the scores as 0/1, pytorch/pytorch#80494);
//  - a 3-D attn_mask [N * num_heads, L, S] is applied per head (libtorch
//    1.13 throws on it);
//  - key and value may differ in their last dim (kdim != vdim; libtorch
//    asserts their sizes are equal).
// out_proj is a shardplan::nn::Linear, so the plan shards it like any Linear
// (row-parallel, `input: sharded`, after head-parallel attention).
//
// Recomputable in mode selective (a plan's `recompute: [{module: ...attn,
// mode: selective}]`): attention's core (scores, masks, softmax, dropout,
// weights times values) keeps only q, k and v and runs again in backward,
// Megatron's selective recomputation.
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any_value.h>
#include <torch/nn/options/activation.h>
#include <torch/nn/pimpl.h>

#include "shardplan/nn/param_gate.h"

#include <memory>
#include <string>
#include <tuple>

#include "shardplan/nn/kv_cache.h"
#include "shardplan/nn/linear.h"
#include "shardplan/recompute.h"

namespace shardplan {
namespace nn {

class MultiheadAttentionImpl;

// How a MultiheadAttention computes with its (possibly sharded) parameters.
// Gets the module itself: the heads' part (MultiheadAttentionImpl::attend)
// and out_proj are the module's to run.
class MultiheadAttentionStrategy {
 public:
  virtual ~MultiheadAttentionStrategy() = default;
  virtual std::tuple<at::Tensor, at::Tensor> forward(MultiheadAttentionImpl& attention, const at::Tensor& query,
                                                     const at::Tensor& key, const at::Tensor& value,
                                                     const at::Tensor& key_padding_mask, bool need_weights,
                                                     const at::Tensor& attn_mask, bool average_attn_weights) = 0;
  virtual std::string describe() const = 0;  // "head-parallel over 'model' (2): 2 of 4 heads per rank"
  // How many parts of the sequence a query arrives in (sequence
  // parallelism's N; 1 when it arrives whole): an attn_mask spans the
  // gathered sequence, N times the query's length.
  virtual int64_t sequence_parts() const { return 1; }
};

class MultiheadAttentionImpl : public torch::nn::Cloneable<MultiheadAttentionImpl>, public GatedLayer,
                               public Recomputable {
 public:
  MultiheadAttentionImpl(int64_t embed_dim, int64_t num_heads)
      : MultiheadAttentionImpl(torch::nn::MultiheadAttentionOptions(embed_dim, num_heads)) {}
  explicit MultiheadAttentionImpl(const torch::nn::MultiheadAttentionOptions& options_);

  // (attn_output [L, N, E], attn_weights): [N, L, S] averaged over heads, or
  // [N, num_heads, L, S] with average_attn_weights = false; undefined when
  // need_weights is false. key_padding_mask: bool [N, S], true = padding.
  // attn_mask: [L, S] or [N * num_heads, L, S], float (added to the scores)
  // or bool (true = may not attend).
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                             const at::Tensor& key_padding_mask = {}, bool need_weights = true,
                                             const at::Tensor& attn_mask = {}, bool average_attn_weights = true);

  // Incremental self-attention for decoding: `x` [L, N, E] are the new
  // positions; their keys and values are appended to `cache` and the queries
  // attend to every cached position (earlier ones and these). attn_mask is
  // [L, S] or [N * num_heads, L, S] over S = the cached positions after the
  // append; leave it undefined for one new position (it may see them all),
  // give the causal [L, S] one for several (a prompt). Returns the attention
  // output [L, N, E]. Goes through the strategy like forward(), so under
  // head-parallel attention the cache holds only this rank's heads. No
  // key_padding_mask, bias_k/bias_v or add_zero_attn (they would need a cache
  // of their own; throws).
  at::Tensor forward_cached(const at::Tensor& x, KVCache& cache, const at::Tensor& attn_mask = {});

  // forward() up to the output projection, for the heads whose rows the
  // projection parameters hold: all of them, unless a plugin left this rank
  // only its own heads' rows of q, k and v. attn_mask is [L, S] or
  // [N * heads, L, S] for exactly those heads. Returns the context
  // [L, N, heads * head_dim] (what out_proj reads) and the attention weights
  // [N * heads, L, S] after dropout, as torch returns them. Inside
  // forward_cached(), k and v are first appended to its cache.
  std::tuple<at::Tensor, at::Tensor> attend(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                            const at::Tensor& key_padding_mask, const at::Tensor& attn_mask);

  void reset() override;
  void _reset_parameters();
  void pretty_print(std::ostream& stream) const override;
  bool can_recompute(RecomputeMode mode) const override { return mode == RecomputeMode::selective; }

  void set_strategy(std::shared_ptr<MultiheadAttentionStrategy> strategy) { strategy_ = std::move(strategy); }
  const std::shared_ptr<MultiheadAttentionStrategy>& strategy() const { return strategy_; }

  torch::nn::MultiheadAttentionOptions options;
  bool _qkv_same_embed_dim = true;
  at::Tensor in_proj_weight;
  at::Tensor in_proj_bias;
  at::Tensor bias_k;
  at::Tensor bias_v;
  Linear out_proj = nullptr;
  at::Tensor q_proj_weight;
  at::Tensor k_proj_weight;
  at::Tensor v_proj_weight;
  int64_t head_dim = 0;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({3, torch::nn::AnyValue(at::Tensor())}, {4, torch::nn::AnyValue(true)},
                           {5, torch::nn::AnyValue(at::Tensor())}, {6, torch::nn::AnyValue(true)})

 private:
  // attend() from the scores on: [attn_output [L, N, heads * head_dim], weights].
  std::vector<at::Tensor> core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& attn_mask, const at::Tensor& key_padding_mask, int64_t bsz,
                               int64_t num_heads);
  std::shared_ptr<MultiheadAttentionStrategy> strategy_;
  KVCache* cache_ = nullptr;  // set for the duration of forward_cached()
};

TORCH_MODULE(MultiheadAttention);

}  // namespace nn
}  // namespace shardplan
