#include "shardplan/nn/embedding.h"

#include <torch/nn/functional/embedding.h>
#include <torch/nn/init.h>

#include <ostream>

#include "shardplan/nn/deferred_init.h"

namespace shardplan {
namespace nn {

EmbeddingImpl::EmbeddingImpl(torch::nn::EmbeddingOptions options_) : options(std::move(options_)) { reset(); }

// Mirrors torch::nn::EmbeddingImpl::reset (same checks, same normalisation of
// a negative padding_idx, same draws from the generator), so unsharded models
// built from either type are bit-identical.
void EmbeddingImpl::reset() {
  if (options.padding_idx().has_value()) {
    const int64_t p = *options.padding_idx();
    if (p > 0) {
      TORCH_CHECK(p < options.num_embeddings(), "Padding_idx must be within num_embeddings");
    } else if (p < 0) {
      TORCH_CHECK(p >= -options.num_embeddings(), "Padding_idx must be within num_embedding");
      options.padding_idx(options.num_embeddings() + p);
    }
  }
  if (!options._weight().defined()) {
    weight = register_parameter("weight", empty_parameter({options.num_embeddings(), options.embedding_dim()}, "Embedding.weight"));
    if (!deferring()) reset_parameters();
  } else {
    TORCH_CHECK(options._weight().sizes() == torch::IntArrayRef({options.num_embeddings(), options.embedding_dim()}),
                "Shape of _weight does not match num_embeddings and embedding_dim");
    weight = register_parameter("weight", options._weight());
  }
}

void EmbeddingImpl::reset_parameters() {
  torch::nn::init::normal_(weight);
  if (options.padding_idx().has_value()) {
    torch::NoGradGuard no_grad;
    weight[*options.padding_idx()].fill_(0);
  }
}

void EmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "shardplan::nn::Embedding(num_embeddings=" << options.num_embeddings()
         << ", embedding_dim=" << options.embedding_dim();
  if (options.padding_idx().has_value()) stream << ", padding_idx=" << *options.padding_idx();
  if (options.max_norm().has_value()) stream << ", max_norm=" << *options.max_norm();
  if (options.norm_type() != 2) stream << ", norm_type=" << options.norm_type();
  if (options.scale_grad_by_freq()) stream << ", scale_grad_by_freq=" << std::boolalpha << true;
  if (options.sparse()) stream << ", sparse=" << std::boolalpha << true;
  if (strategy_) stream << ", " << strategy_->describe();
  stream << ")";
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& indices) {
  const ParamGateScope gate(*this);
  check_materialized(weight, "shardplan::nn::Embedding", "weight");
  if (strategy_) return gate.out(strategy_->forward(indices, weight, options));
  return gate.out(embedding_lookup(indices, weight, options));
}

at::Tensor embedding_lookup(const at::Tensor& indices, const at::Tensor& weight,
                            const torch::nn::EmbeddingOptions& options) {
  torch::nn::functional::EmbeddingFuncOptions f;
  f.padding_idx(options.padding_idx());
  f.max_norm(options.max_norm());
  f.norm_type(options.norm_type());
  f.scale_grad_by_freq(options.scale_grad_by_freq());
  f.sparse(options.sparse());
  return torch::nn::functional::embedding(indices, weight, f);
}

}  // namespace nn
}  // namespace shardplan
