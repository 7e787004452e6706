#include "models/gpt2.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cctype>
#include <limits>
#include <sstream>

#include "models/config.h"
#include "models/corpus.h"
#include "models/generate.h"
#include "shardplan/error.h"
#include "shardplan/mappings.h"
#include "shardplan/nn/deferred_init.h"
#include "shardplan/tied.h"
#include "shardplan/weights.h"

namespace shardplan {
namespace examples {

namespace {

[[noreturn]] void bad_config(const std::string& what) { throw Error("model 'gpt2': " + what); }

std::string num(int64_t v) { return std::to_string(v); }

// Hugging Face's GPT2PreTrainedModel._init_weights: normal(0, 0.02) for the
// projections and embeddings, zero biases. Under DeferredInit the values
// come from a file and there is no memory to write.
void init_normal(const at::Tensor& w) {
  if (shardplan::nn::deferring()) return;
  at::NoGradGuard no_grad;
  w.normal_(0, 0.02);
}

shardplan::nn::Linear linear(int64_t in, int64_t out) {
  shardplan::nn::Linear l(torch::nn::LinearOptions(in, out));
  init_normal(l->weight);
  if (!shardplan::nn::deferring()) {
    at::NoGradGuard no_grad;
    l->bias.zero_();
  }
  return l;
}

shardplan::nn::LayerNorm layer_norm(const GPT2Config& c) {
  return shardplan::nn::LayerNorm(torch::nn::LayerNormOptions({c.embed}).eps(c.ln_eps));
}

// [B, T, H*D] -> [B, H, T, D].
at::Tensor split_heads(const at::Tensor& y, int64_t heads, int64_t d) {
  return y.view({y.size(0), y.size(1), heads, d}).transpose(1, 2);
}

}  // namespace

at::Tensor gelu_new(const at::Tensor& x) {
  return 0.5 * x * (1.0 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * at::pow(x, 3.0))));
}

GPT2Config GPT2Config::from(const Overrides& overrides) {
  GPT2Config c;
  ConfigReader r("gpt2", overrides);
  r.get("vocab", c.vocab);
  r.get("context", c.context);
  r.get("embed", c.embed);
  r.get("heads", c.heads);
  r.get("layers", c.layers);
  r.get("mlp", c.mlp);
  r.get("ln_eps", c.ln_eps);
  r.get("attn_buffers", c.attn_buffers);
  r.finish();
  for (auto kv : {std::make_pair("vocab", c.vocab), std::make_pair("context", c.context),
                  std::make_pair("embed", c.embed), std::make_pair("heads", c.heads), std::make_pair("mlp", c.mlp)})
    if (kv.second < 1) bad_config(std::string(kv.first) + " must be at least 1, got " + num(kv.second));
  if (c.embed % c.heads != 0) bad_config("embed " + num(c.embed) + " is not divisible by heads " + num(c.heads));
  if (!(c.ln_eps > 0)) bad_config("ln_eps must be positive");
  if (c.attn_buffers > 1) bad_config("attn_buffers must be 0 or 1, got " + num(c.attn_buffers));
  return c;
}

std::string GPT2Config::str() const {
  std::ostringstream s;
  s << "vocab=" << vocab << " context=" << context << " embed=" << embed << " heads=" << heads << " layers=" << layers
    << " mlp=" << mlp << " ln_eps=" << ln_eps << " attn_buffers=" << attn_buffers;
  return s.str();
}

// ------------------------------------------------------------ attention

GPT2AttentionImpl::GPT2AttentionImpl(const GPT2Config& config_) : config(config_) { reset(); }

void GPT2AttentionImpl::reset() {
  const int64_t e = config.embed, n = config.context;
  c_attn = register_module("c_attn", linear(e, 3 * e));
  c_proj = register_module("c_proj", linear(e, e));
  // Whole heads of q, k and v per rank (the plan's head_dim: auto).
  c_attn->out_head_dim = config.head_dim();
  c_proj->in_head_dim = config.head_dim();
  if (!config.attn_buffers) return;
  bias = register_buffer("bias", at::ones({n, n}).tril().view({1, 1, n, n}));
  masked_bias = register_buffer("masked_bias", at::scalar_tensor(-1e4));
}

at::Tensor GPT2AttentionImpl::forward(const at::Tensor& x, int64_t past, shardplan::nn::KVCache* cache) {
  const int64_t d = config.head_dim();
  const at::Tensor qkv = c_attn->forward(x);
  // q, k and v are a third each of what this rank's c_attn gives: whole
  // heads under plans/gpt2.yaml (blocks: 3), every head unsharded.
  const int64_t width = qkv.size(-1) / 3;
  if (qkv.size(-1) % 3 != 0 || width % d != 0 || width == 0)
    throw Error("gpt2 attention: c_attn gives " + num(qkv.size(-1)) +
                " features on this rank, not q, k and v of whole heads of " + num(d) +
                ": cut c_attn by heads in 3 blocks (the plan's blocks: 3, head_dim: auto)");
  const int64_t heads = width / d, b = x.size(0), t = x.size(1);
  // narrow, not split: auto_plan's walk from c_proj back to c_attn reads slices.
  const at::Tensor q = split_heads(qkv.narrow(-1, 0, width), heads, d);
  at::Tensor k = split_heads(qkv.narrow(-1, width, width), heads, d);
  at::Tensor v = split_heads(qkv.narrow(-1, 2 * width, width), heads, d);
  if (cache) {
    auto kv = cache->append(k.reshape({b * heads, t, d}), v.reshape({b * heads, t, d}));
    k = kv.first.view({b, heads, -1, d});
    v = kv.second.view({b, heads, -1, d});
  }
  const int64_t s = k.size(2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));  // [B, H, T, S]
  if (t > 1)
    scores = scores + at::full({t, s}, -std::numeric_limits<double>::infinity(), scores.options()).triu(s - t + 1);
  const bool low = scores.scalar_type() == at::kHalf || scores.scalar_type() == at::kBFloat16;
  const at::Tensor probs = low ? at::softmax(scores, -1, at::kFloat).to(scores.scalar_type()) : at::softmax(scores, -1);
  const at::Tensor ctx = at::matmul(probs, v);  // [B, H, T, D]
  return c_proj->forward(ctx.transpose(1, 2).reshape({b, t, heads * d}));
}

// ------------------------------------------------------------ MLP, block

GPT2MLPImpl::GPT2MLPImpl(const GPT2Config& config_) : config(config_) { reset(); }

void GPT2MLPImpl::reset() {
  c_fc = register_module("c_fc", linear(config.embed, config.mlp));
  c_proj = register_module("c_proj", linear(config.mlp, config.embed));
}

at::Tensor GPT2MLPImpl::forward(const at::Tensor& x) { return c_proj->forward(gelu_new(c_fc->forward(x))); }

GPT2BlockImpl::GPT2BlockImpl(const GPT2Config& config_) : config(config_) { reset(); }

void GPT2BlockImpl::reset() {
  ln_1 = register_module("ln_1", layer_norm(config));
  attn = register_module("attn", GPT2Attention(config));
  ln_2 = register_module("ln_2", layer_norm(config));
  mlp = register_module("mlp", GPT2MLP(config));
}

at::Tensor GPT2BlockImpl::forward(const at::Tensor& x, int64_t past, shardplan::nn::KVCache* cache) {
  // A cache is filled once: decoding never recomputes.
  if (cache) return body(x, past, cache);
  return recompute_full([this, past](const std::vector<at::Tensor>& in) { return body(in[0], past, nullptr); }, {x});
}

at::Tensor GPT2BlockImpl::body(const at::Tensor& x, int64_t past, shardplan::nn::KVCache* cache) {
  const at::Tensor h = x + attn->forward(ln_1->forward(x), past, cache);
  return h + mlp->forward(ln_2->forward(h));
}

GPT2ModelImpl::GPT2ModelImpl(const GPT2Config& config_) : config(config_) { reset(); }

void GPT2ModelImpl::reset() {
  wte = register_module("wte", shardplan::nn::Embedding(config.vocab, config.embed));
  init_normal(wte->weight);
  wpe = register_module("wpe", shardplan::nn::Embedding(config.context, config.embed));
  init_normal(wpe->weight);
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.layers; ++i) h->push_back(GPT2Block(config));
  ln_f = register_module("ln_f", layer_norm(config));
}

at::Tensor GPT2ModelImpl::embed(const at::Tensor& tokens, int64_t past) {
  const int64_t t = tokens.size(1);
  return wte->forward(tokens) + wpe->forward(at::arange(past, past + t, tokens.options()));
}

at::Tensor GPT2ModelImpl::forward(const at::Tensor& tokens, int64_t past, std::vector<shardplan::nn::KVCache>* caches) {
  at::Tensor x = embed(tokens, past);
  size_t i = 0;
  for (const auto& block : *h) {
    shardplan::nn::KVCache* cache = caches ? &(*caches)[i++] : nullptr;
    x = block->as<GPT2BlockImpl>()->forward(x, past, cache);
  }
  return ln_f->forward(x);
}

// ------------------------------------------------------------ LM

GPT2Impl::GPT2Impl(const GPT2Config& config_) : config(config_) { reset(); }

void GPT2Impl::reset() {
  transformer = register_module("transformer", GPT2Model(config));
  lm_head = register_module("lm_head",
                            shardplan::nn::Linear(torch::nn::LinearOptions(config.embed, config.vocab).bias(false)));
  loss_fn = register_module("loss", shardplan::nn::CrossEntropyLoss());
  tie();
}

void GPT2Impl::tie() { lm_head->weight = tie_parameter(*lm_head, "weight", transformer->wte->weight); }

std::shared_ptr<torch::nn::Module> GPT2Impl::clone(const c10::optional<at::Device>& device) const {
  auto copy = torch::nn::Cloneable<GPT2Impl>::clone(device);
  std::dynamic_pointer_cast<GPT2Impl>(copy)->tie();
  return copy;
}

void GPT2Impl::check_tokens(const at::Tensor& tokens, int64_t past) const {
  if (tokens.dim() != 2) throw Error("gpt2: tokens must be [batch, time], got " + num(tokens.dim()) + " dims");
  if (past + tokens.size(1) > config.context)
    throw Error("gpt2: " + num(past) + " cached + " + num(tokens.size(1)) + " new positions exceed the context of " +
                num(config.context));
}

at::Tensor GPT2Impl::forward(const at::Tensor& tokens) {
  check_tokens(tokens, 0);
  return lm_head->forward(transformer->forward(tokens, 0, nullptr));
}

at::Tensor GPT2Impl::full_logits(const at::Tensor& logits) const { return vocab_whole(*lm_head, logits); }

std::vector<shardplan::nn::KVCache> GPT2Impl::make_caches() const {
  return std::vector<shardplan::nn::KVCache>(transformer->h->size(), shardplan::nn::KVCache(config.context));
}

at::Tensor GPT2Impl::forward_cached(const at::Tensor& tokens, std::vector<shardplan::nn::KVCache>& caches) {
  if (caches.size() != transformer->h->size())
    throw Error("gpt2: " + num(caches.size()) + " key/value caches for " + num(transformer->h->size()) +
                " blocks (make_caches() gives one per block)");
  const int64_t past = caches.empty() ? 0 : caches[0].length();
  check_tokens(tokens, past);
  return full_logits(lm_head->forward(transformer->forward(tokens, past, &caches))).transpose(0, 1);
}

// This rank's heads are a third of c_attn's rows over the head size.
CausalLM::CacheBytes GPT2Impl::cache_bytes(int64_t batch) const {
  const int64_t d = config.head_dim(), esize = lm_head->weight.element_size();
  int64_t local = config.heads;
  if (!transformer->h->is_empty()) local = transformer->h->ptr<GPT2BlockImpl>(0)->attn->c_attn->weight.size(0) / 3 / d;
  const int64_t per_head = 2 * config.layers * batch * config.context * d * esize;
  return {local * per_head, config.heads * per_head};
}

at::Tensor GPT2Impl::loss(const Batch& batch) { return output_loss(forward(batch.input), batch.target); }

at::Tensor GPT2Impl::output_loss(const at::Tensor& logits, const at::Tensor& target) {
  return loss_fn->forward(logits.reshape({-1, logits.size(-1)}), target.reshape(-1));
}

std::vector<std::vector<std::string>> GPT2Impl::pieces() const {
  std::vector<std::vector<std::string>> out{{"transformer.wte", "transformer.wpe"}};
  for (size_t i = 0; i < transformer->h->size(); ++i) out.push_back({"transformer.h." + std::to_string(i)});
  out.push_back({"transformer.ln_f", "lm_head"});
  return out;
}

// forward() piece by piece, the same operations.
at::Tensor GPT2Impl::forward_piece(size_t index, const at::Tensor& input) {
  const size_t blocks = transformer->h->size();
  if (index == 0) {
    check_tokens(input, 0);
    return transformer->embed(input, 0);
  }
  if (index <= blocks) return transformer->h->ptr<GPT2BlockImpl>(index - 1)->forward(input, 0, nullptr);
  if (index == blocks + 1) return lm_head->forward(transformer->ln_f->forward(input));
  throw Error("gpt2: piece " + num(static_cast<int64_t>(index)) + " of " + num(static_cast<int64_t>(blocks + 2)));
}

Batch GPT2Impl::sample(at::Generator& gen, int64_t batch_size, const Corpus* corpus) const {
  if (!corpus) throw Error("gpt2: needs a text corpus");
  if (config.vocab < Corpus::kVocab) throw Error("gpt2: a byte-level corpus needs vocab >= " + num(Corpus::kVocab));
  at::Tensor w = corpus->windows(gen, batch_size, config.context + 1);
  return {w.narrow(1, 0, config.context), w.narrow(1, 1, config.context)};
}

namespace {

// (transformer.)h.N.attn.bias or .attn.masked_bias, matched by hand: the
// names come from a file (std::regex recurses per character).
bool is_attn_buffer(std::string name) {
  if (name.rfind("transformer.", 0) == 0) name = name.substr(12);
  if (name.rfind("h.", 0) != 0) return false;
  size_t i = 2;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  const std::string rest = name.substr(i);
  return i > 2 && (rest == ".attn.bias" || rest == ".attn.masked_bias");
}

}  // namespace

bool gpt2_weights_have_attn_buffers(const std::string& path) {
  for (const auto& named : weights_shapes(path))
    if (is_attn_buffer(named.first)) return true;
  return false;
}

}  // namespace examples
}  // namespace shardplan
