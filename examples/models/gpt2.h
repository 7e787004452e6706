#pragma once
// GPT-2 (Hugging Face's GPT2LMHeadModel) built from shardable layers, with
// Hugging Face's parameter names, so that plans/gpt2.yaml and a checkpoint
// written for the Python model apply unchanged:
//
//   transformer.wte                    token embedding (lm_head is tied to it)
//   transformer.wpe                    learned position embedding
//   transformer.h.i.ln_1               LayerNorm
//   transformer.h.i.attn.c_attn        q, k, v stacked: Linear [3E, E] + bias
//   transformer.h.i.attn.c_proj        Linear [E, E] + bias
//   transformer.h.i.ln_2               LayerNorm
//   transformer.h.i.mlp.c_fc, c_proj   gelu_new (tanh) MLP
//   transformer.ln_f                   final LayerNorm
//   lm_head                            tied to transformer.wte
//   loss                               cross-entropy (a module: vocab-parallel under a plan)
//
// Hugging Face's Conv1D keeps its weight [in, out]; ours are Linear
// [out, in], and the files' layout is handled on load and save
// (WeightsOptions::transposed, gpt2_weights_options). Activations are
// batch-first [B, T, E]. The attention takes its heads from what c_attn
// returns: q, k and v each a third of it, so under plans/gpt2.yaml
// (c_attn column-parallel, blocks: 3) a rank computes with its own heads.
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
#include "shardplan/pipeline.h"
#include "shardplan/recompute.h"

namespace shardplan {
namespace examples {

struct GPT2Config {
  int64_t vocab = 256;    // vocab_size (byte-level by default)
  int64_t context = 64;   // n_positions
  int64_t embed = 128;    // n_embd
  int64_t heads = 4;      // n_head
  int64_t layers = 2;     // n_layer
  int64_t mlp = 512;      // n_inner (Hugging Face's default: 4 * n_embd)
  double ln_eps = 1e-5;   // layer_norm_epsilon
  // 1: each attention keeps the attn.bias / attn.masked_bias buffers older
  // GPT-2 files carry, so they load strictly (the trainers set it when the
  // file has them); 0: none, and no [context, context] mask per layer.
  int64_t attn_buffers = 0;

  int64_t head_dim() const { return embed / heads; }
  static GPT2Config from(const Overrides& overrides);
  std::string str() const;
};

class GPT2AttentionImpl : public torch::nn::Cloneable<GPT2AttentionImpl> {
 public:
  explicit GPT2AttentionImpl(const GPT2Config& config = {});
  void reset() override;
  // x [B, T, E] at positions past..past+T-1; with a cache the new keys and
  // values are appended and the queries attend to all of them.
  at::Tensor forward(const at::Tensor& x, int64_t past = 0, shardplan::nn::KVCache* cache = nullptr);

  GPT2Config config;
  shardplan::nn::Linear c_attn{nullptr}, c_proj{nullptr};
  // Older GPT-2 files carry the causal mask and its fill value as buffers
  // (attn.bias, attn.masked_bias): kept with config.attn_buffers, so such
  // files load as they are. The forward computes its own mask and reads neither.
  at::Tensor bias, masked_bias;
};
TORCH_MODULE(GPT2Attention);

class GPT2MLPImpl : public torch::nn::Cloneable<GPT2MLPImpl> {
 public:
  explicit GPT2MLPImpl(const GPT2Config& config = {});
  void reset() override;
  at::Tensor forward(const at::Tensor& x);

  GPT2Config config;
  shardplan::nn::Linear c_fc{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(GPT2MLP);

// Recomputable (full): `recompute: ['transformer\.h\.\d+']` keeps only each block's input.
class GPT2BlockImpl : public torch::nn::Cloneable<GPT2BlockImpl>, public shardplan::Recomputable {
 public:
  explicit GPT2BlockImpl(const GPT2Config& config = {});
  void reset() override;
  at::Tensor forward(const at::Tensor& x, int64_t past = 0, shardplan::nn::KVCache* cache = nullptr);

  GPT2Config config;
  shardplan::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  GPT2Attention attn{nullptr};
  GPT2MLP mlp{nullptr};

 private:
  at::Tensor body(const at::Tensor& x, int64_t past, shardplan::nn::KVCache* cache);
};
TORCH_MODULE(GPT2Block);

// Hugging Face's GPT2Model: what sits under "transformer.".
class GPT2ModelImpl : public torch::nn::Cloneable<GPT2ModelImpl> {
 public:
  explicit GPT2ModelImpl(const GPT2Config& config = {});
  void reset() override;
  at::Tensor embed(const at::Tensor& tokens, int64_t past);  // [B, T] -> [B, T, E]
  // tokens [B, T] -> final hidden states [B, T, E]; `caches` empty or one per block.
  at::Tensor forward(const at::Tensor& tokens, int64_t past, std::vector<shardplan::nn::KVCache>* caches);

  GPT2Config config;
  shardplan::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  shardplan::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(GPT2Model);

class GPT2Impl : public torch::nn::Cloneable<GPT2Impl>,
                 public ExampleModel,
                 public CausalLM,
                 public shardplan::PipelineModel {
 public:
  explicit GPT2Impl(const GPT2Config& config = {});
  void reset() override;
  // A clone re-ties lm_head to transformer.wte.
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<at::Device>& device = c10::nullopt) const override;
  // tokens [B, T] -> logits [B, T, V] (this rank's vocabulary slice when the
  // plan leaves the head's output split).
  at::Tensor forward(const at::Tensor& tokens);
  at::Tensor full_logits(const at::Tensor& logits) const;

  int64_t vocab_size() const override { return config.vocab; }
  int64_t context_size() const override { return config.context; }
  std::vector<shardplan::nn::KVCache> make_caches() const override;
  at::Tensor forward_cached(const at::Tensor& tokens, std::vector<shardplan::nn::KVCache>& caches) override;
  CacheBytes cache_bytes(int64_t batch) const override;

  // Pipeline pieces: {transformer.wte, transformer.wpe}, each block,
  // {transformer.ln_f, lm_head}; the first and last share the tied embedding.
  std::vector<std::vector<std::string>> pieces() const override;
  at::Tensor forward_piece(size_t index, const at::Tensor& input) override;

  at::Tensor loss(const Batch& batch) override;
  at::Tensor output_loss(const at::Tensor& logits, const at::Tensor& target) override;  // logits [B, T, V]
  Batch sample(at::Generator& gen, int64_t batch_size, const Corpus* corpus) const override;
  bool needs_corpus() const override { return true; }
  int64_t items_per_sample() const override { return config.context; }
  std::string config_str() const override { return config.str(); }

  GPT2Config config;
  GPT2Model transformer{nullptr};
  shardplan::nn::Linear lm_head{nullptr};
  shardplan::nn::CrossEntropyLoss loss_fn{nullptr};  // registered as "loss"

 private:
  void tie();
  void check_tokens(const at::Tensor& tokens, int64_t past) const;
};
TORCH_MODULE(GPT2);

// Hugging Face's gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
at::Tensor gelu_new(const at::Tensor& x);

// Whether the weights at `path` hold the attention buffers older GPT-2
// files carry (h.N.attn.bias / attn.masked_bias, with or without
// "transformer."): from the headers only.
bool gpt2_weights_have_attn_buffers(const std::string& path);

}  // namespace examples
}  // namespace shardplan
