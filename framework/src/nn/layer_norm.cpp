#include "shardplan/nn/layer_norm.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <ostream>

#include "shardplan/nn/deferred_init.h"

namespace shardplan {
namespace nn {

LayerNormImpl::LayerNormImpl(torch::nn::LayerNormOptions options_) : options(std::move(options_)) { reset(); }

// Mirrors torch::nn::LayerNormImpl::reset: same parameters, same values.
void LayerNormImpl::reset() {
  if (options.elementwise_affine()) {
    weight = register_parameter("weight", empty_parameter(options.normalized_shape()));
    bias = register_parameter("bias", empty_parameter(options.normalized_shape()));
  } else {
    weight = register_parameter("weight", {}, /*requires_grad=*/false);
    bias = register_parameter("bias", {}, /*requires_grad=*/false);
  }
  if (!deferring()) reset_parameters();
}

void LayerNormImpl::reset_parameters() {
  if (options.elementwise_affine()) {
    torch::nn::init::ones_(weight);
    torch::nn::init::zeros_(bias);
  }
}

void LayerNormImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "shardplan::nn::LayerNorm(" << torch::IntArrayRef(options.normalized_shape())
         << ", eps=" << options.eps() << ", elementwise_affine=" << options.elementwise_affine();
  if (strategy_) stream << ", " << strategy_->describe();
  stream << ")";
}

at::Tensor LayerNormImpl::forward(const at::Tensor& input) {
  const ParamGateScope gate(*this);
  check_materialized(weight, "shardplan::nn::LayerNorm", "weight");
  check_materialized(bias, "shardplan::nn::LayerNorm", "bias");
  if (strategy_) return gate.out(strategy_->forward(input, weight, bias, options));
  return gate.out(at::layer_norm(input, options.normalized_shape(), weight, bias, options.eps()));
}

}  // namespace nn
}  // namespace shardplan
