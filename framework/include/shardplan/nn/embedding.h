#pragma once
// shardplan::nn::Embedding: torch::nn::Embedding with a seam for parallelism.
// Same options, parameter name ("weight"), initialisation and state_dict keys
// as torch::nn::Embedding, so a vanilla checkpoint loads into it and back.
// With no strategy installed its forward is torch::nn::Embedding's.
// parallelize() installs an EmbeddingStrategy from a layer plugin.
#include <torch/nn/cloneable.h>
#include <torch/nn/options/embedding.h>
#include <torch/nn/pimpl.h>

#include "shardplan/nn/param_gate.h"

#include <memory>
#include <string>

namespace shardplan {
namespace nn {

// How an Embedding looks ids up in its (possibly sharded) weight. `options`
// are the module's, with padding_idx already made non-negative (global).
class EmbeddingStrategy {
 public:
  virtual ~EmbeddingStrategy() = default;
  virtual at::Tensor forward(const at::Tensor& input, const at::Tensor& weight,
                             const torch::nn::EmbeddingOptions& options) = 0;
  virtual std::string describe() const = 0;  // "vocab-parallel over 'model' (2)"
};

class EmbeddingImpl : public torch::nn::Cloneable<EmbeddingImpl>, public GatedLayer {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim)
      : EmbeddingImpl(torch::nn::EmbeddingOptions(num_embeddings, embedding_dim)) {}
  explicit EmbeddingImpl(torch::nn::EmbeddingOptions options_);

  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& indices);

  void set_strategy(std::shared_ptr<EmbeddingStrategy> strategy) { strategy_ = std::move(strategy); }
  const std::shared_ptr<EmbeddingStrategy>& strategy() const { return strategy_; }

  torch::nn::EmbeddingOptions options;
  at::Tensor weight;

 private:
  std::shared_ptr<EmbeddingStrategy> strategy_;
};

TORCH_MODULE(Embedding);

// torch::nn::Embedding's lookup with `options`: what EmbeddingImpl::forward
// does without a strategy, for strategies that look up a whole table.
at::Tensor embedding_lookup(const at::Tensor& indices, const at::Tensor& weight,
                            const torch::nn::EmbeddingOptions& options);

}  // namespace nn
}  // namespace shardplan
