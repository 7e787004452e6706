#include "shardplan/nn/linear.h"

#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>

#include <cmath>
#include <ostream>

#include "shardplan/nn/deferred_init.h"

namespace shardplan {
namespace nn {

LinearImpl::LinearImpl(const torch::nn::LinearOptions& options_) : options(options_) { reset(); }

// Mirrors torch::nn::LinearImpl::reset so both draw the same numbers from the
// same generator: unsharded models built from either type are bit-identical.
void LinearImpl::reset() {
  weight = register_parameter("weight", empty_parameter({options.out_features(), options.in_features()}, "Linear.weight"));
  if (options.bias()) {
    bias = register_parameter("bias", empty_parameter(options.out_features(), "Linear.bias"));
  } else {
    bias = register_parameter("bias", {}, /*requires_grad=*/false);
  }
  if (!deferring()) reset_parameters();
}

void LinearImpl::reset_parameters() {
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
  if (bias.defined()) {
    int64_t fan_in, fan_out;
    std::tie(fan_in, fan_out) = torch::nn::init::_calculate_fan_in_and_fan_out(weight);
    const auto bound = 1 / std::sqrt(fan_in);
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

void LinearImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "shardplan::nn::Linear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << ", bias=" << options.bias();
  if (strategy_) stream << ", " << strategy_->describe();
  stream << ")";
}

at::Tensor LinearImpl::forward(const at::Tensor& input) {
  const ParamGateScope gate(*this);
  check_materialized(weight, "shardplan::nn::Linear", "weight");
  check_materialized(bias, "shardplan::nn::Linear", "bias");
  if (strategy_) return gate.out(strategy_->forward(input, weight, bias));
  return gate.out(torch::nn::functional::linear(input, weight, bias));
}

}  // namespace nn
}  // namespace shardplan
