#pragma once
// A Llama-family decoder (Hugging Face's LlamaForCausalLM) built from
// shardable layers, with Hugging Face's parameter names, so that a plan (or
// a state dict) written for the Python model applies unchanged:
//
//   model.embed_tokens                       token embedding
//   model.layers.i.input_layernorm           RMSNorm
//   model.layers.i.self_attn.{q,k,v,o}_proj  attention, no biases: rotary
//                                            positions (rotate-half), grouped
//                                            queries (kv_heads <= heads)
//   model.layers.i.post_attention_layernorm  RMSNorm
//   model.layers.i.mlp.{gate,up,down}_proj   SwiGLU: down(silu(gate) * up)
//   model.norm                               final RMSNorm
//   lm_head                                  untied (tie=1: the embedding's)
//   loss                                     cross-entropy (a module, so a
//                                            plan can make it vocab-parallel)
//
// Activations are batch-first, [B, T, E], as Hugging Face's: under sequence
// parallelism the sequence is dim 1 (plans/llama_sp.yaml). The attention
// takes its head counts from what its projections return, so it computes
// with this rank's heads whatever the plan left it (plans/llama.yaml).
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
#include "shardplan/nn/linear.h"
#include "shardplan/nn/rms_norm.h"
#include "shardplan/pipeline.h"
#include "shardplan/recompute.h"

namespace shardplan {
namespace examples {

struct LlamaConfig {
  int64_t vocab = 256;  // byte-level
  int64_t context = 64;
  int64_t embed = 128;    // hidden_size
  int64_t heads = 4;      // num_attention_heads
  int64_t kv_heads = 2;   // num_key_value_heads: 1 multi-query, = heads multi-head
  int64_t layers = 2;     // num_hidden_layers
  int64_t mlp = 352;      // intermediate_size
  double rope_theta = 10000;
  double rms_eps = 1e-6;  // rms_norm_eps
  int64_t tie = 0;        // tie_word_embeddings: 1 shares lm_head.weight with the embedding
  // config.json's model_type, the family whose modeling code this computes:
  //   llama   as above;
  //   qwen2   q_proj, k_proj and v_proj with biases (o_proj without);
  //   mistral `window` (sliding_window): a query at position i attends to
  //           keys j with i - window < j <= i, and each cache keeps the last
  //           `window` positions only;
  //   gemma   the embedding's output times sqrt(embed) (rounded to the
  //           activations' dtype), RMSNorm x * (1 + w) (the file holds w),
  //           GeGLU with tanh GELU, `head_dim` from the config;
  //   phi3    as llama (its fused tensors are the weights loader's).
  std::string family = "llama";
  int64_t head_size = 0;  // head_dim (mistral, gemma): 0 is embed / heads
  int64_t window = 0;     // sliding_window (mistral): 0 attends to every earlier position

  int64_t head_dim() const { return head_size ? head_size : embed / heads; }
  bool qkv_bias() const { return family == "qwen2"; }
  bool gemma() const { return family == "gemma"; }
  static LlamaConfig from(const Overrides& overrides);
  std::string str() const;
};

// Recomputable: full (its whole forward) or selective (scores, softmax and
// weights times values keep only q, k and v).
class LlamaAttentionImpl : public torch::nn::Cloneable<LlamaAttentionImpl>, public shardplan::Recomputable {
 public:
  explicit LlamaAttentionImpl(const LlamaConfig& config = {});
  void reset() override;
  bool can_recompute(shardplan::RecomputeMode mode) const override {
    return mode != shardplan::RecomputeMode::none;
  }
  // x [B, T, E] (under sequence parallelism this rank's positions; the
  // projections gather them). Positions start at `past`; with a cache the
  // new keys and values are appended and the queries attend to all of them.
  at::Tensor forward(const at::Tensor& x, int64_t past = 0, shardplan::nn::KVCache* cache = nullptr);

  LlamaConfig config;
  shardplan::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  at::Tensor body(const at::Tensor& x, int64_t past, shardplan::nn::KVCache* cache);
};
TORCH_MODULE(LlamaAttention);

class LlamaMLPImpl : public torch::nn::Cloneable<LlamaMLPImpl> {
 public:
  explicit LlamaMLPImpl(const LlamaConfig& config = {});
  void reset() override;
  at::Tensor forward(const at::Tensor& x);

  LlamaConfig config;
  shardplan::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

// Recomputable (full): a plan's `recompute: ['model\.layers\.\d+']` keeps only each layer's input.
class LlamaDecoderLayerImpl : public torch::nn::Cloneable<LlamaDecoderLayerImpl>, public shardplan::Recomputable {
 public:
  explicit LlamaDecoderLayerImpl(const LlamaConfig& config = {});
  void reset() override;
  at::Tensor forward(const at::Tensor& x, int64_t past = 0, shardplan::nn::KVCache* cache = nullptr);

  LlamaConfig config;
  shardplan::nn::RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};

 private:
  at::Tensor body(const at::Tensor& x, int64_t past, shardplan::nn::KVCache* cache);
};
TORCH_MODULE(LlamaDecoderLayer);

// Hugging Face's LlamaModel: what sits under "model.".
class LlamaModelImpl : public torch::nn::Cloneable<LlamaModelImpl> {
 public:
  explicit LlamaModelImpl(const LlamaConfig& config = {});
  void reset() override;
  // tokens [B, T] -> final hidden states [B, T, E]; `caches` empty or one per layer.
  at::Tensor forward(const at::Tensor& tokens, int64_t past, std::vector<shardplan::nn::KVCache>* caches);
  // tokens [B, T] -> the first layer's input (gemma scales the embedding).
  at::Tensor embed(const at::Tensor& tokens);

  LlamaConfig config;
  shardplan::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  shardplan::nn::RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

class LlamaImpl : public torch::nn::Cloneable<LlamaImpl>,
                  public ExampleModel,
                  public CausalLM,
                  public shardplan::PipelineModel {
 public:
  explicit LlamaImpl(const LlamaConfig& config = {});
  void reset() override;
  // A clone re-ties lm_head to the embedding (Module::clone copies each
  // module on its own).
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<at::Device>& device = c10::nullopt) const override;
  // tokens [B, T] -> logits [B, T, V] (this rank's vocabulary slice when the
  // plan leaves the head's output split).
  at::Tensor forward(const at::Tensor& tokens);
  // `logits` with the vocabulary whole: gathered over the head's group when
  // the plan left them split.
  at::Tensor full_logits(const at::Tensor& logits) const;

  // CausalLM (examples/models/generate.h): one cache per layer, holding this
  // rank's kv heads; forward_cached returns [T, B, V], the vocabulary whole.
  int64_t vocab_size() const override { return config.vocab; }
  int64_t context_size() const override { return config.context; }
  std::vector<shardplan::nn::KVCache> make_caches() const override;
  at::Tensor forward_cached(const at::Tensor& tokens, std::vector<shardplan::nn::KVCache>& caches) override;
  CacheBytes cache_bytes(int64_t batch) const override;

  // Pipeline pieces (shardplan/pipeline.h): model.embed_tokens, each layer,
  // {model.norm, lm_head}; with tie=1 the first and last share the
  // embedding, whose gradient the pipeline sums between their stages.
  std::vector<std::vector<std::string>> pieces() const override;
  at::Tensor forward_piece(size_t index, const at::Tensor& input) override;

  at::Tensor loss(const Batch& batch) override;
  at::Tensor output_loss(const at::Tensor& logits, const at::Tensor& target) override;  // logits [B, T, V]
  Batch sample(at::Generator& gen, int64_t batch_size, const Corpus* corpus) const override;
  bool needs_corpus() const override { return true; }
  int64_t items_per_sample() const override { return config.context; }
  std::string config_str() const override { return config.str(); }

  LlamaConfig config;
  LlamaModel model{nullptr};
  shardplan::nn::Linear lm_head{nullptr};
  shardplan::nn::CrossEntropyLoss loss_fn{nullptr};  // registered as "loss"

 private:
  void tie();
};
TORCH_MODULE(Llama);

// Hugging Face's rotary position embedding (rotate-half convention) of
// x [B, H, T, D] at positions past .. past+T-1: x*cos + rotate_half(x)*sin
// with angles pos * theta^(-2i/D), computed in float32 (float64 for a
// float64 x) and cast to x's dtype, as LlamaRotaryEmbedding does.
at::Tensor apply_rotary(const at::Tensor& x, int64_t past, double theta);

}  // namespace examples
}  // namespace shardplan
