#include "models/gpt.h"

#include <ATen/ATen.h>

#include <limits>
#include <sstream>

#include "models/config.h"
#include "models/corpus.h"
#include "models/generate.h"
#include "shardplan/error.h"
#include "shardplan/communicator.h"
#include "shardplan/mappings.h"
#include "shardplan/nn/gelu.h"

namespace shardplan {
namespace examples {

GPTConfig GPTConfig::from(const Overrides& overrides) {
  GPTConfig c;
  ConfigReader r("gpt", overrides);
  r.get("vocab", c.vocab);
  r.get("context", c.context);
  r.get("embed", c.embed);
  r.get("heads", c.heads);
  r.get("layers", c.layers);
  r.get("mlp", c.mlp);
  r.get("dropout", c.dropout);
  r.finish();
  if (c.vocab < 1 || c.context < 1 || c.embed < 1 || c.heads < 1 || c.mlp < 1)
    throw Error("model 'gpt': vocab, context, embed, heads and mlp must be at least 1");
  if (c.embed % c.heads != 0)
    throw Error("model 'gpt': embed " + std::to_string(c.embed) + " is not divisible by heads " +
                std::to_string(c.heads));
  return c;
}

std::string GPTConfig::str() const {
  std::ostringstream s;
  s << "vocab=" << vocab << " context=" << context << " embed=" << embed << " heads=" << heads << " layers=" << layers
    << " mlp=" << mlp << " dropout=" << dropout;
  return s.str();
}

GPTBlockImpl::GPTBlockImpl(const GPTConfig& config_) : config(config_) { reset(); }

void GPTBlockImpl::reset() {
  const int64_t e = config.embed;
  ln1 = register_module("ln1", shardplan::nn::LayerNorm(torch::nn::LayerNormOptions({e})));
  attn = register_module("attn", shardplan::nn::MultiheadAttention(
                                     torch::nn::MultiheadAttentionOptions(e, config.heads).dropout(config.dropout)));
  ln2 = register_module("ln2", shardplan::nn::LayerNorm(torch::nn::LayerNormOptions({e})));
  fc1 = register_module("fc1", shardplan::nn::Linear(e, config.mlp));
  fc2 = register_module("fc2", shardplan::nn::Linear(config.mlp, e));
}

at::Tensor GPTBlockImpl::forward(const at::Tensor& x, const at::Tensor& mask) {
  return recompute_full([this](const std::vector<at::Tensor>& in) { return body(in[0], in[1]); }, {x, mask});
}

at::Tensor GPTBlockImpl::body(const at::Tensor& x, const at::Tensor& mask) {
  at::Tensor h = ln1->forward(x);
  at::Tensor y = x + std::get<0>(attn->forward(h, h, h, {}, /*need_weights=*/false, mask));
  return y + mlp(y);
}

at::Tensor GPTBlockImpl::forward_cached(const at::Tensor& x, const at::Tensor& mask, shardplan::nn::KVCache& cache) {
  at::Tensor y = x + attn->forward_cached(ln1->forward(x), cache, mask);
  return y + mlp(y);
}

at::Tensor GPTBlockImpl::mlp(const at::Tensor& y) { return fc2->forward(shardplan::gelu(fc1->forward(ln2->forward(y)))); }

GPTImpl::GPTImpl(const GPTConfig& config_) : config(config_) { reset(); }

void GPTImpl::reset() {
  tok_emb = register_module("tok_emb", shardplan::nn::Embedding(config.vocab, config.embed));
  pos_emb = register_module("pos_emb", shardplan::nn::Embedding(config.context, config.embed));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.layers; ++i) blocks->push_back(GPTBlock(config));
  ln_f = register_module("ln_f", shardplan::nn::LayerNorm(torch::nn::LayerNormOptions({config.embed})));
  head =
      register_module("head", shardplan::nn::Linear(torch::nn::LinearOptions(config.embed, config.vocab).bias(false)));
  loss_fn = register_module("loss", shardplan::nn::CrossEntropyLoss());
}

at::Tensor GPTImpl::forward(const at::Tensor& tokens) {
  at::Tensor x = embed(tokens);
  // The whole sequence's: under sequence parallelism x holds T/N positions.
  const at::Tensor mask = causal_mask(tokens.size(1), x);
  for (const auto& block : *blocks) x = block->as<GPTBlockImpl>()->forward(x, mask);
  return head->forward(ln_f->forward(x));
}

at::Tensor GPTImpl::embed(const at::Tensor& tokens) {
  if (tokens.dim() != 2)
    throw Error("gpt: tokens must be [batch, time], got " + std::to_string(tokens.dim()) + " dims");
  const int64_t t = tokens.size(1);
  if (t > config.context)
    throw Error("gpt: " + std::to_string(t) + " tokens exceed the context of " + std::to_string(config.context));
  // Seq-first, as MultiheadAttention takes it.
  return tok_emb->forward(tokens.t()) + pos_emb->forward(at::arange(t, tokens.options())).unsqueeze(1);
}

at::Tensor GPTImpl::causal_mask(int64_t t, const at::Tensor& x) {
  return at::full({t, t}, -std::numeric_limits<double>::infinity(), x.options()).triu(1);
}

std::vector<std::vector<std::string>> GPTImpl::pieces() const {
  std::vector<std::vector<std::string>> out{{"tok_emb", "pos_emb"}};
  for (size_t i = 0; i < blocks->size(); ++i) out.push_back({"blocks." + std::to_string(i)});
  out.push_back({"ln_f", "head"});
  return out;
}

// The same operations as forward(), piece by piece: a pipelined GPT equals
// the whole one to the last bit.
at::Tensor GPTImpl::forward_piece(size_t index, const at::Tensor& input) {
  if (index == 0) return embed(input);
  if (index <= blocks->size()) {
    // Under sequence parallelism the input holds T/N positions; the mask
    // spans the T the attention gathers.
    const auto& block = blocks->ptr<GPTBlockImpl>(index - 1);
    const auto& s = block->attn->strategy();
    return block->forward(input, causal_mask(input.size(0) * (s ? s->sequence_parts() : 1), input));
  }
  if (index == blocks->size() + 1) return head->forward(ln_f->forward(input));
  throw Error("gpt: piece " + std::to_string(index) + " of " + std::to_string(blocks->size() + 2));
}

std::vector<shardplan::nn::KVCache> GPTImpl::make_caches() const {
  return std::vector<shardplan::nn::KVCache>(blocks->size(), shardplan::nn::KVCache(config.context));
}

at::Tensor GPTImpl::forward_cached(const at::Tensor& tokens, std::vector<shardplan::nn::KVCache>& caches) {
  if (tokens.dim() != 2)
    throw Error("gpt: tokens must be [batch, time], got " + std::to_string(tokens.dim()) + " dims");
  if (caches.size() != blocks->size())
    throw Error("gpt: " + std::to_string(caches.size()) + " key/value caches for " + std::to_string(blocks->size()) +
                " blocks (make_caches() gives one per block)");
  const int64_t past = caches.empty() ? 0 : caches[0].length(), t = tokens.size(1);
  if (past + t > config.context)
    throw Error("gpt: " + std::to_string(past) + " cached + " + std::to_string(t) +
                " new positions exceed the context of " + std::to_string(config.context));
  at::Tensor x =
      tok_emb->forward(tokens.t()) + pos_emb->forward(at::arange(past, past + t, tokens.options())).unsqueeze(1);
  // One new position may attend to everything cached; several (a prompt)
  // each to the cache and the new ones up to itself.
  at::Tensor mask;
  if (t > 1) mask = at::full({t, past + t}, -std::numeric_limits<double>::infinity(), x.options()).triu(past + 1);
  size_t i = 0;
  for (const auto& block : *blocks) x = block->as<GPTBlockImpl>()->forward_cached(x, mask, caches[i++]);
  return full_logits(head->forward(ln_f->forward(x)));
}

// Each rank caches its own heads: a third of its fused q/k/v rows.
CausalLM::CacheBytes GPTImpl::cache_bytes(int64_t batch) const {
  const int64_t esize = head->weight.element_size(), per_width = 2 * config.layers * batch * config.context * esize;
  int64_t width = config.embed;
  if (config.layers > 0) {
    const at::Tensor& w = blocks->ptr<GPTBlockImpl>(0)->attn->in_proj_weight;
    if (w.defined()) width = w.size(0) / 3;
  }
  return {width * per_width, config.embed * per_width};
}

at::Tensor GPTImpl::full_logits(const at::Tensor& logits) const { return vocab_whole(*head, logits); }

at::Tensor GPTImpl::loss(const Batch& batch) { return output_loss(forward(batch.input), batch.target); }

at::Tensor GPTImpl::output_loss(const at::Tensor& logits, const at::Tensor& target) {
  return loss_fn->forward(logits.reshape({-1, logits.size(-1)}), target.t().reshape(-1));
}

Batch GPTImpl::sample(at::Generator& gen, int64_t batch_size, const Corpus* corpus) const {
  if (!corpus) throw Error("gpt: needs a text corpus");
  if (config.vocab < Corpus::kVocab)
    throw Error("gpt: a byte-level corpus needs vocab >= " + std::to_string(Corpus::kVocab));
  at::Tensor w = corpus->windows(gen, batch_size, config.context + 1);
  return {w.narrow(1, 0, config.context), w.narrow(1, 1, config.context)};
}

// plans/gpt.yaml moves, per rank and step (N = batch * context tokens,
// E = embed, L = layers; each all-reduce counted as its buffer):
//   forward:  the vocab-parallel embedding's all-reduce [N, E]; per block the
//             row-parallel all-reduces after attention and after the MLP
//             [N, E] each; the vocab-parallel loss's max, sum-exp and
//             target-logit reductions [N] each.
//   backward: per block the input-gradient all-reduces entering attention and
//             the MLP [N, E] each; the LM head's input gradient [N, E].
// Nothing else: the position embedding, LayerNorms and biases are replicated
// and see identical inputs, so their gradients agree without communication.
int64_t GPTImpl::min_comm_bytes(int64_t batch_size, int world, int64_t element_size) const {
  if (world <= 1) return 0;
  const int64_t n = batch_size * config.context;
  return (2 * n * config.embed * (2 * config.layers + 1) + 3 * n) * element_size;
}

}  // namespace examples
}  // namespace shardplan
