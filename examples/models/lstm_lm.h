#pragma once
// An LSTM language model built from shardable layers: token embedding, a
// (multi-layer) LSTM, a linear LM head and the cross-entropy loss as child
// module "loss" (plans/lstm_lm.yaml shards all four).
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>

#include "models/model.h"
#include "shardplan/nn/cross_entropy.h"
#include "shardplan/nn/embedding.h"
#include "shardplan/nn/linear.h"
#include "shardplan/nn/lstm.h"

namespace shardplan {
namespace examples {

struct LSTMLMConfig {
  int64_t vocab = 256;  // byte-level
  int64_t context = 64;
  int64_t embed = 64;
  int64_t hidden = 128;
  int64_t layers = 1;

  static LSTMLMConfig from(const Overrides& overrides);
  std::string str() const;
};

class LSTMLMImpl : public torch::nn::Cloneable<LSTMLMImpl>, public ExampleModel {
 public:
  explicit LSTMLMImpl(const LSTMLMConfig& config = {});
  void reset() override;
  // tokens [B, T] -> logits [T, B, V] (this rank's vocab slice when the
  // head's output is left sharded by the plan).
  at::Tensor forward(const at::Tensor& tokens);

  at::Tensor loss(const Batch& batch) override;
  Batch sample(at::Generator& gen, int64_t batch_size, const Corpus* corpus) const override;
  bool needs_corpus() const override { return true; }
  int64_t items_per_sample() const override { return config.context; }
  std::string config_str() const override { return config.str(); }

  LSTMLMConfig config;
  shardplan::nn::Embedding embedding{nullptr};
  shardplan::nn::LSTM lstm{nullptr};
  shardplan::nn::Linear head{nullptr};
  shardplan::nn::CrossEntropyLoss loss_fn{nullptr};  // registered as "loss"
};
TORCH_MODULE(LSTMLM);

}  // namespace examples
}  // namespace shardplan
