#pragma once
// A GPT-style decoder-only language model built from shardable layers:
// token + position embeddings, pre-LayerNorm blocks (causal multi-head
// self-attention, then a GELU MLP, each added to the residual stream), a
// final LayerNorm, an LM head and the cross-entropy loss as a child module
// named "loss", so a plan can reach it by its path (plans/gpt.yaml).
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "models/model.h"
#include "shardplan/nn/cross_entropy.h"
#include "shardplan/nn/embedding.h"
#include "shardplan/nn/kv_cache.h"
#include "shardplan/nn/layer_norm.h"
#include "shardplan/nn/linear.h"
#include "shardplan/nn/multihead_attention.h"
#include "shardplan/pipeline.h"
#include "shardplan/recompute.h"

namespace shardplan {
namespace examples {

struct GPTConfig {
  int64_t vocab = 256;  // byte-level
  int64_t context = 64;
  int64_t embed = 128;
  int64_t heads = 4;
  int64_t layers = 2;
  int64_t mlp = 512;   // hidden width of each block's MLP
  double dropout = 0;  // on the attention weights

  static GPTConfig from(const Overrides& overrides);
  std::string str() const;
};

// One pre-LN block over seq-first activations [T, B, E]. Recomputable: a
// plan's `recompute: ['blocks\.\d+']` keeps only each block's input.
class GPTBlockImpl : public torch::nn::Cloneable<GPTBlockImpl>, public shardplan::Recomputable {
 public:
  explicit GPTBlockImpl(const GPTConfig& config = {});
  void reset() override;
  // mask: additive causal attention mask [T, T].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask);
  // The same over new positions only, attending through `cache` (see
  // GPTImpl::forward_cached); mask [T, S] or undefined.
  at::Tensor forward_cached(const at::Tensor& x, const at::Tensor& mask, shardplan::nn::KVCache& cache);

  GPTConfig config;
  shardplan::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  shardplan::nn::MultiheadAttention attn{nullptr};
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr};

 private:
  at::Tensor body(const at::Tensor& x, const at::Tensor& mask);
  at::Tensor mlp(const at::Tensor& y);
};
TORCH_MODULE(GPTBlock);

class GPTImpl : public torch::nn::Cloneable<GPTImpl>,
                public ExampleModel,
                public CausalLM,
                public shardplan::PipelineModel {
 public:
  explicit GPTImpl(const GPTConfig& config = {});
  void reset() override;
  // tokens [B, T] -> logits [T, B, V] (this rank's vocab slice when the
  // head's output is left sharded by the plan).
  at::Tensor forward(const at::Tensor& tokens);

  // Incremental decoding (examples/models/generate.h). One key/value cache
  // per block, for the whole context: under plans/gpt.yaml each holds only
  // this rank's heads.
  std::vector<shardplan::nn::KVCache> make_caches() const override;
  // tokens [B, T]: the next T positions after the caches' (the prompt, then
  // one token at a time); their keys and values are appended to `caches`.
  // Returns their logits [T, B, V] over the whole vocabulary on every rank:
  // a vocab-parallel head's slices are gathered (V/N per rank and token).
  // Throws when the positions would pass the context.
  at::Tensor forward_cached(const at::Tensor& tokens, std::vector<shardplan::nn::KVCache>& caches) override;
  int64_t vocab_size() const override { return config.vocab; }
  int64_t context_size() const override { return config.context; }
  CacheBytes cache_bytes(int64_t batch) const override;
  // `logits` from forward() (or the head) with the vocabulary whole: gathered
  // over the head's group when the plan left them split.
  at::Tensor full_logits(const at::Tensor& logits) const;

  // Pipeline pieces (shardplan/pipeline.h): {tok_emb, pos_emb}, each block,
  // {ln_f, head}; piece 0 takes tokens [B, T], the last returns forward()'s logits.
  std::vector<std::vector<std::string>> pieces() const override;
  at::Tensor forward_piece(size_t index, const at::Tensor& input) override;

  at::Tensor loss(const Batch& batch) override;
  at::Tensor output_loss(const at::Tensor& logits, const at::Tensor& target) override;  // logits [T, B, V]
  Batch sample(at::Generator& gen, int64_t batch_size, const Corpus* corpus) const override;
  bool needs_corpus() const override { return true; }
  int64_t items_per_sample() const override { return config.context; }
  int64_t min_comm_bytes(int64_t batch_size, int world, int64_t element_size) const override;
  std::string config_str() const override { return config.str(); }

  GPTConfig config;
  shardplan::nn::Embedding tok_emb{nullptr}, pos_emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  shardplan::nn::LayerNorm ln_f{nullptr};
  shardplan::nn::Linear head{nullptr};
  shardplan::nn::CrossEntropyLoss loss_fn{nullptr};  // registered as "loss"

 private:
  at::Tensor embed(const at::Tensor& tokens);  // tokens [B, T] -> [T, B, E]
  static at::Tensor causal_mask(int64_t t, const at::Tensor& x);  // additive, [t, t], in x's dtype
};
TORCH_MODULE(GPT);

}  // namespace examples
}  // namespace shardplan
