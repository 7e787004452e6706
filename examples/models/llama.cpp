#include "models/llama.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "models/config.h"
#include "models/corpus.h"
#include "models/generate.h"
#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/mappings.h"
#include "shardplan/nn/deferred_init.h"
#include "shardplan/tied.h"

namespace shardplan {
namespace examples {

namespace {

[[noreturn]] void bad_config(const std::string& what) { throw Error("model 'llama': " + what); }

std::string num(int64_t v) { return std::to_string(v); }

// Hugging Face's LlamaPreTrainedModel._init_weights: normal(0, 0.02) for
// every Linear and Embedding weight (RMSNorm weights are ones). Under
// DeferredInit the weights come from a file and have no memory to write.
void init_normal(const at::Tensor& w) {
  if (shardplan::nn::deferring()) return;
  at::NoGradGuard no_grad;
  w.normal_(0, 0.02);
}

// Biases start at zero, as _init_weights sets them.
shardplan::nn::Linear linear(int64_t in, int64_t out, bool bias = false) {
  shardplan::nn::Linear l(torch::nn::LinearOptions(in, out).bias(bias));
  init_normal(l->weight);
  if (bias && !shardplan::nn::deferring()) {
    at::NoGradGuard no_grad;
    l->bias.zero_();
  }
  return l;
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

// Heads in the last dim of a projection's output [B, T, H*D] -> [B, H, T, D].
at::Tensor split_heads(const at::Tensor& y, int64_t heads, int64_t d) {
  return y.view({y.size(0), y.size(1), heads, d}).transpose(1, 2);
}

// Scores in float32 for float16/bfloat16, as Hugging Face's eager attention
// takes its softmax.
at::Tensor softmax_last(const at::Tensor& s) {
  const bool low = s.scalar_type() == at::kHalf || s.scalar_type() == at::kBFloat16;
  return low ? at::softmax(s, -1, at::kFloat).to(s.scalar_type()) : at::softmax(s, -1);
}

// The s keys end at the t queries' last position. A key is masked after
// its query, and with a window also `window` or more positions before it
// (the query at i sees i - window < j <= i, Mistral's sliding window).
at::Tensor windowed_scores(const at::Tensor& scores, int64_t t, int64_t s, int64_t window) {
  const auto opts = scores.options().dtype(at::kLong);
  const at::Tensor behind = at::arange(t, opts).unsqueeze(1) - at::arange(s, opts).unsqueeze(0) + (s - t);
  return scores.masked_fill(behind.lt(0).logical_or(behind.ge(window)), -std::numeric_limits<double>::infinity());
}

// Scores, causal mask, softmax, weights times values: [B, H, T, D].
at::Tensor attention_core(at::Tensor q, at::Tensor k, at::Tensor v, int64_t groups, int64_t t, int64_t d,
                          int64_t window) {
  // Grouped queries: query head j reads kv head j / groups (HF's repeat_kv).
  if (groups != 1) {
    k = k.repeat_interleave(groups, 1);
    v = v.repeat_interleave(groups, 1);
  }
  const int64_t s = k.size(2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));  // [B, H, T, S]
  if (window && s > window)
    scores = windowed_scores(scores, t, s, window);
  else if (t > 1)
    scores = scores + at::full({t, s}, -std::numeric_limits<double>::infinity(), scores.options()).triu(s - t + 1);
  // at::matmul's bmm, through recompute_final_bmm: a selective rerun skips
  // the product, whose result backward does not need.
  const at::Tensor probs = softmax_last(scores);
  const int64_t bh = probs.size(0) * probs.size(1);
  return shardplan::recompute_final_bmm(probs.reshape({bh, t, s}), v.reshape({bh, s, d}))
      .view({probs.size(0), probs.size(1), t, d});
}

// The options a family's config.json can say; one it cannot would be saved
// back without them, into a file Python computes differently.
void check_family(const LlamaConfig& c) {
  const std::string& f = c.family;
  if (f != "llama" && f != "qwen2" && f != "mistral" && f != "gemma" && f != "phi3")
    bad_config("family '" + f + "' is not one of: llama, qwen2, mistral, gemma, phi3");
  if (c.window && f != "mistral" && f != "phi3")
    bad_config("window (sliding_window) is mistral's and phi3's, not family " + f + "'s");
  const bool own_head_dim = f == "mistral" || f == "gemma";
  if (c.head_size && !own_head_dim && (c.embed % c.heads != 0 || c.head_size != c.embed / c.heads))
    bad_config("head_dim " + num(c.head_size) + " is not embed / heads; only mistral and gemma say their own");
}

// Gemma's RMSNorm scales by 1 + w (and its weights start at zero).
shardplan::nn::RMSNormOptions norm_options(const LlamaConfig& c) {
  return shardplan::nn::RMSNormOptions(c.embed).eps(c.rms_eps).unit_offset(c.gemma());
}

}  // namespace

LlamaConfig LlamaConfig::from(const Overrides& overrides) {
  LlamaConfig c;
  ConfigReader r("llama", overrides);
  r.get("vocab", c.vocab);
  r.get("context", c.context);
  r.get("embed", c.embed);
  r.get("heads", c.heads);
  r.get("kv_heads", c.kv_heads);
  r.get("layers", c.layers);
  r.get("mlp", c.mlp);
  r.get("rope_theta", c.rope_theta);
  r.get("rms_eps", c.rms_eps);
  r.get("tie", c.tie);
  r.get("family", c.family);
  r.get("head_dim", c.head_size);
  r.get("window", c.window);
  r.finish();
  check_family(c);
  for (auto kv : {std::make_pair("vocab", c.vocab), std::make_pair("context", c.context),
                  std::make_pair("embed", c.embed), std::make_pair("heads", c.heads),
                  std::make_pair("kv_heads", c.kv_heads), std::make_pair("mlp", c.mlp)})
    if (kv.second < 1) bad_config(std::string(kv.first) + " must be at least 1, got " + num(kv.second));
  if (!c.head_size && c.embed % c.heads != 0) bad_config("embed " + num(c.embed) + " is not divisible by heads " + num(c.heads));
  if (c.heads % c.kv_heads != 0)
    bad_config("heads " + num(c.heads) + " is not divisible by kv_heads " + num(c.kv_heads) +
               " (each kv head serves heads/kv_heads query heads)");
  if (c.head_dim() % 2 != 0)
    bad_config(std::string(c.head_size ? "head_dim" : "the head size embed/heads") + " = " + num(c.head_dim()) +
               " must be even (rotary embeddings rotate pairs)");
  if (!(c.rope_theta > 0)) bad_config("rope_theta must be positive");
  if (!(c.rms_eps > 0)) bad_config("rms_eps must be positive");
  if (c.tie > 1) bad_config("tie must be 0 or 1, got " + num(c.tie));
  return c;
}

std::string LlamaConfig::str() const {
  std::ostringstream s;
  s << "vocab=" << vocab << " context=" << context << " embed=" << embed << " heads=" << heads
    << " kv_heads=" << kv_heads << " layers=" << layers << " mlp=" << mlp << " rope_theta=" << rope_theta
    << " rms_eps=" << rms_eps << " tie=" << tie;
  // Only what differs from llama, so that its line stays what it was.
  if (family != "llama") s << " family=" << family;
  if (head_size) s << " head_dim=" << head_size;
  if (window) s << " window=" << window;
  return s.str();
}

at::Tensor apply_rotary(const at::Tensor& x, int64_t past, double theta) {
  const int64_t t = x.size(-2), d = x.size(-1);
  const auto dtype = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto opts = x.options().dtype(dtype);
  const at::Tensor inv_freq = 1.0 / at::pow(theta, at::arange(0, d, 2, opts) / static_cast<double>(d));
  const at::Tensor freqs = at::outer(at::arange(past, past + t, opts), inv_freq);  // [T, D/2]
  const at::Tensor angles = at::cat({freqs, freqs}, -1);                           // [T, D]
  const at::Tensor cos = angles.cos().to(x.scalar_type()), sin = angles.sin().to(x.scalar_type());
  return x * cos + rotate_half(x) * sin;
}

// ------------------------------------------------------------ attention

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& config_) : config(config_) { reset(); }

void LlamaAttentionImpl::reset() {
  const int64_t e = config.embed, d = config.head_dim();
  const bool bias = config.qkv_bias();
  q_proj = register_module("q_proj", linear(e, config.heads * d, bias));
  k_proj = register_module("k_proj", linear(e, config.kv_heads * d, bias));
  v_proj = register_module("v_proj", linear(e, config.kv_heads * d, bias));
  o_proj = register_module("o_proj", linear(config.heads * d, e));
  // Said here so a plan need not repeat it (head_dim: auto), and a plan that
  // says another size is refused rather than cutting through heads.
  for (auto* p : {&q_proj, &k_proj, &v_proj}) (*p)->out_head_dim = d;
  o_proj->in_head_dim = d;
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, int64_t past, shardplan::nn::KVCache* cache) {
  // A cache is filled once: decoding never recomputes.
  if (cache) return body(x, past, cache);
  return recompute_full([this, past](const std::vector<at::Tensor>& in) { return body(in[0], past, nullptr); }, {x});
}

at::Tensor LlamaAttentionImpl::body(const at::Tensor& x, int64_t past, shardplan::nn::KVCache* cache) {
  const int64_t d = config.head_dim();
  const at::Tensor q_all = q_proj->forward(x), k_all = k_proj->forward(x), v_all = v_proj->forward(x);
  // This rank's heads are what its projections returned: whole heads under
  // plans/llama.yaml, every head unsharded.
  const int64_t hq = q_all.size(-1) / d, hkv = k_all.size(-1) / d;
  if (q_all.size(-1) % d != 0 || k_all.size(-1) % d != 0 || hkv < 1 || hq % hkv != 0 || v_all.sizes() != k_all.sizes())
    throw Error("llama attention: q_proj gives " + num(q_all.size(-1)) + " features and k_proj " +
                num(k_all.size(-1)) + " on this rank, not whole heads of " + num(d) +
                " with the query heads a multiple of the kv heads: shard q/k/v by whole heads (the plan's head_dim: " +
                num(d) + ")");
  const int64_t b = q_all.size(0), t = q_all.size(1);
  at::Tensor q = apply_rotary(split_heads(q_all, hq, d), past, config.rope_theta);
  at::Tensor k = apply_rotary(split_heads(k_all, hkv, d), past, config.rope_theta);
  at::Tensor v = split_heads(v_all, hkv, d);
  if (cache) {
    auto kv = cache->append(k.reshape({b * hkv, t, d}), v.reshape({b * hkv, t, d}));
    k = kv.first.view({b, hkv, -1, d});
    v = kv.second.view({b, hkv, -1, d});
  }
  // Selective recomputation keeps q, k and v (before the grouped queries' repeat).
  const at::Tensor ctx = recompute_selective(
      [hq, hkv, t, d, window = config.window](const std::vector<at::Tensor>& in) {
        return std::vector<at::Tensor>{attention_core(in[0], in[1], in[2], hq / hkv, t, d, window)};
      },
      {q, k, v})[0];  // [B, H, T, D]
  return o_proj->forward(ctx.transpose(1, 2).reshape({b, t, hq * d}));
}

// ------------------------------------------------------------ MLP, layer

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& config_) : config(config_) { reset(); }

void LlamaMLPImpl::reset() {
  gate_proj = register_module("gate_proj", linear(config.embed, config.mlp));
  up_proj = register_module("up_proj", linear(config.embed, config.mlp));
  down_proj = register_module("down_proj", linear(config.mlp, config.embed));
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& x) {
  const at::Tensor gate = gate_proj->forward(x);
  // GemmaMLP's gelu_pytorch_tanh: GeGLU.
  const at::Tensor act = config.gemma() ? at::gelu(gate, "tanh") : at::silu(gate);
  return down_proj->forward(act * up_proj->forward(x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& config_) : config(config_) { reset(); }

void LlamaDecoderLayerImpl::reset() {
  const auto norm = norm_options(config);
  input_layernorm = register_module("input_layernorm", shardplan::nn::RMSNorm(norm));
  self_attn = register_module("self_attn", LlamaAttention(config));
  post_attention_layernorm = register_module("post_attention_layernorm", shardplan::nn::RMSNorm(norm));
  mlp = register_module("mlp", LlamaMLP(config));
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x, int64_t past, shardplan::nn::KVCache* cache) {
  if (cache) return body(x, past, cache);
  return recompute_full([this, past](const std::vector<at::Tensor>& in) { return body(in[0], past, nullptr); }, {x});
}

at::Tensor LlamaDecoderLayerImpl::body(const at::Tensor& x, int64_t past, shardplan::nn::KVCache* cache) {
  const at::Tensor h = x + self_attn->forward(input_layernorm->forward(x), past, cache);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& config_) : config(config_) { reset(); }

void LlamaModelImpl::reset() {
  embed_tokens = register_module("embed_tokens", shardplan::nn::Embedding(config.vocab, config.embed));
  init_normal(embed_tokens->weight);
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.layers; ++i) layers->push_back(LlamaDecoderLayer(config));
  norm = register_module("norm", shardplan::nn::RMSNorm(norm_options(config)));
}

at::Tensor LlamaModelImpl::embed(const at::Tensor& tokens) {
  const at::Tensor x = embed_tokens->forward(tokens);
  // GemmaModel: hidden_size**0.5 as a tensor of the activations' dtype
  // (33.94 is 34.0 in bfloat16), then the product.
  if (!config.gemma()) return x;
  return x * at::scalar_tensor(std::sqrt(static_cast<double>(config.embed)), x.options());
}

at::Tensor LlamaModelImpl::forward(const at::Tensor& tokens, int64_t past, std::vector<shardplan::nn::KVCache>* caches) {
  at::Tensor x = embed(tokens);
  size_t i = 0;
  for (const auto& layer : *layers) {
    shardplan::nn::KVCache* cache = caches ? &(*caches)[i++] : nullptr;
    x = layer->as<LlamaDecoderLayerImpl>()->forward(x, past, cache);
  }
  return norm->forward(x);
}

// ------------------------------------------------------------ LM

LlamaImpl::LlamaImpl(const LlamaConfig& config_) : config(config_) { reset(); }

void LlamaImpl::reset() {
  model = register_module("model", LlamaModel(config));
  lm_head = register_module("lm_head", linear(config.embed, config.vocab));
  loss_fn = register_module("loss", shardplan::nn::CrossEntropyLoss());
  if (config.tie) tie();
}

void LlamaImpl::tie() { lm_head->weight = tie_parameter(*lm_head, "weight", model->embed_tokens->weight); }

std::shared_ptr<torch::nn::Module> LlamaImpl::clone(const c10::optional<at::Device>& device) const {
  auto copy = torch::nn::Cloneable<LlamaImpl>::clone(device);
  if (config.tie) std::dynamic_pointer_cast<LlamaImpl>(copy)->tie();
  return copy;
}

at::Tensor LlamaImpl::forward(const at::Tensor& tokens) {
  if (tokens.dim() != 2) throw Error("llama: tokens must be [batch, time], got " + num(tokens.dim()) + " dims");
  if (tokens.size(1) > config.context)
    throw Error("llama: " + num(tokens.size(1)) + " tokens exceed the context of " + num(config.context));
  return lm_head->forward(model->forward(tokens, 0, nullptr));
}

at::Tensor LlamaImpl::full_logits(const at::Tensor& logits) const { return vocab_whole(*lm_head, logits); }

std::vector<shardplan::nn::KVCache> LlamaImpl::make_caches() const {
  return std::vector<shardplan::nn::KVCache>(model->layers->size(),
                                            shardplan::nn::KVCache(config.context, config.window));
}

at::Tensor LlamaImpl::forward_cached(const at::Tensor& tokens, std::vector<shardplan::nn::KVCache>& caches) {
  if (tokens.dim() != 2) throw Error("llama: tokens must be [batch, time], got " + num(tokens.dim()) + " dims");
  if (caches.size() != model->layers->size())
    throw Error("llama: " + num(caches.size()) + " key/value caches for " + num(model->layers->size()) +
                " layers (make_caches() gives one per layer)");
  const int64_t past = caches.empty() ? 0 : caches[0].length(), t = tokens.size(1);
  if (past + t > config.context)
    throw Error("llama: " + num(past) + " cached + " + num(t) + " new positions exceed the context of " +
                num(config.context));
  return full_logits(lm_head->forward(model->forward(tokens, past, &caches))).transpose(0, 1);
}

// This rank's kv heads follow from its query heads (q_proj's rows): kv/N of
// them when the axis divides the kv heads, else one (replicated).
CausalLM::CacheBytes LlamaImpl::cache_bytes(int64_t batch) const {
  const int64_t d = config.head_dim(), esize = lm_head->weight.element_size();
  int64_t local_q = config.heads;
  if (!model->layers->is_empty())
    local_q = model->layers->ptr<LlamaDecoderLayerImpl>(0)->self_attn->q_proj->weight.size(0) / d;
  const int64_t local_kv = std::max<int64_t>(1, local_q * config.kv_heads / config.heads);
  const int64_t positions = config.window ? std::min(config.window, config.context) : config.context;
  const int64_t per_head = 2 * config.layers * batch * positions * d * esize;
  return {local_kv * per_head, config.kv_heads * per_head};
}

at::Tensor LlamaImpl::loss(const Batch& batch) {
  return output_loss(forward(batch.input), batch.target);
}

at::Tensor LlamaImpl::output_loss(const at::Tensor& logits, const at::Tensor& target) {
  return loss_fn->forward(logits.reshape({-1, logits.size(-1)}), target.reshape(-1));
}

std::vector<std::vector<std::string>> LlamaImpl::pieces() const {
  std::vector<std::vector<std::string>> out{{"model.embed_tokens"}};
  for (size_t i = 0; i < model->layers->size(); ++i) out.push_back({"model.layers." + std::to_string(i)});
  out.push_back({"model.norm", "lm_head"});
  return out;
}

// forward() piece by piece, the same operations.
at::Tensor LlamaImpl::forward_piece(size_t index, const at::Tensor& input) {
  const size_t layers = model->layers->size();
  if (index == 0) {
    if (input.dim() != 2) throw Error("llama: tokens must be [batch, time], got " + num(input.dim()) + " dims");
    if (input.size(1) > config.context)
      throw Error("llama: " + num(input.size(1)) + " tokens exceed the context of " + num(config.context));
    return model->embed(input);
  }
  if (index <= layers) return model->layers->ptr<LlamaDecoderLayerImpl>(index - 1)->forward(input, 0, nullptr);
  if (index == layers + 1) return lm_head->forward(model->norm->forward(input));
  throw Error("llama: piece " + num(static_cast<int64_t>(index)) + " of " + num(static_cast<int64_t>(layers + 2)));
}

Batch LlamaImpl::sample(at::Generator& gen, int64_t batch_size, const Corpus* corpus) const {
  if (!corpus) throw Error("llama: needs a text corpus");
  if (config.vocab < Corpus::kVocab) throw Error("llama: a byte-level corpus needs vocab >= " + num(Corpus::kVocab));
  at::Tensor w = corpus->windows(gen, batch_size, config.context + 1);
  return {w.narrow(1, 0, config.context), w.narrow(1, 1, config.context)};
}

}  // namespace examples
}  // namespace shardplan
