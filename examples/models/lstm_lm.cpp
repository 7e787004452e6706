#include "models/lstm_lm.h"

#include <ATen/ATen.h>

#include <sstream>

#include "models/config.h"
#include "models/corpus.h"
#include "shardplan/error.h"

namespace shardplan {
namespace examples {

LSTMLMConfig LSTMLMConfig::from(const Overrides& overrides) {
  LSTMLMConfig c;
  ConfigReader r("lstm_lm", overrides);
  r.get("vocab", c.vocab);
  r.get("context", c.context);
  r.get("embed", c.embed);
  r.get("hidden", c.hidden);
  r.get("layers", c.layers);
  r.finish();
  if (c.vocab < 1 || c.context < 1 || c.embed < 1 || c.hidden < 1 || c.layers < 1)
    throw Error("model 'lstm_lm': vocab, context, embed, hidden and layers must be at least 1");
  return c;
}

std::string LSTMLMConfig::str() const {
  std::ostringstream s;
  s << "vocab=" << vocab << " context=" << context << " embed=" << embed << " hidden=" << hidden
    << " layers=" << layers;
  return s.str();
}

LSTMLMImpl::LSTMLMImpl(const LSTMLMConfig& config_) : config(config_) { reset(); }

void LSTMLMImpl::reset() {
  embedding = register_module("embedding", shardplan::nn::Embedding(config.vocab, config.embed));
  lstm = register_module(
      "lstm", shardplan::nn::LSTM(torch::nn::LSTMOptions(config.embed, config.hidden).num_layers(config.layers)));
  head = register_module("head", shardplan::nn::Linear(config.hidden, config.vocab));
  loss_fn = register_module("loss", shardplan::nn::CrossEntropyLoss());
}

at::Tensor LSTMLMImpl::forward(const at::Tensor& tokens) {
  if (tokens.dim() != 2)
    throw Error("lstm_lm: tokens must be [batch, time], got " + std::to_string(tokens.dim()) + " dims");
  // Seq-first, the LSTM's default layout.
  at::Tensor out = std::get<0>(lstm->forward(embedding->forward(tokens.t())));
  return head->forward(out);
}

at::Tensor LSTMLMImpl::loss(const Batch& batch) {
  at::Tensor logits = forward(batch.input);  // [T, B, V]
  return loss_fn->forward(logits.reshape({-1, logits.size(-1)}), batch.target.t().reshape(-1));
}

Batch LSTMLMImpl::sample(at::Generator& gen, int64_t batch_size, const Corpus* corpus) const {
  if (!corpus) throw Error("lstm_lm: needs a text corpus");
  if (config.vocab < Corpus::kVocab)
    throw Error("lstm_lm: a byte-level corpus needs vocab >= " + std::to_string(Corpus::kVocab));
  at::Tensor w = corpus->windows(gen, batch_size, config.context + 1);
  return {w.narrow(1, 0, config.context), w.narrow(1, 1, config.context)};
}

}  // namespace examples
}  // namespace shardplan
