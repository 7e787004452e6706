#include "shardplan/nn/rms_norm.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <ostream>

#include "shardplan/error.h"
#include "shardplan/nn/deferred_init.h"

namespace shardplan {
namespace nn {

at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps, bool unit_offset) {
  if (input.dim() < 1 || (weight.defined() && input.size(-1) != weight.size(0)))
    throw Error("RMSNorm: input's last dim (" + std::to_string(input.dim() ? input.size(-1) : 0) +
                ") must be the normalised dim (" + std::to_string(weight.defined() ? weight.size(0) : 0) + ")");
  const bool low = input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16;
  const at::Tensor x = low ? input.to(at::kFloat) : input;
  const at::Tensor n = x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps);
  if (unit_offset && weight.defined()) return (n * (weight.to(n.scalar_type()) + 1)).to(input.scalar_type());
  const at::Tensor y = n.to(input.scalar_type());
  return weight.defined() ? weight * y : y;
}

RMSNormImpl::RMSNormImpl(const RMSNormOptions& options_) : options(options_) { reset(); }

void RMSNormImpl::reset() {
  if (options.dim() < 1) throw Error("RMSNorm: dim must be at least 1, got " + std::to_string(options.dim()));
  weight = register_parameter("weight", empty_parameter({options.dim()}, "RMSNorm.weight"));
  if (!deferring()) reset_parameters();
}

void RMSNormImpl::reset_parameters() {
  if (options.unit_offset())
    torch::nn::init::zeros_(weight);
  else
    torch::nn::init::ones_(weight);
}

void RMSNormImpl::pretty_print(std::ostream& stream) const {
  stream << "shardplan::nn::RMSNorm(" << options.dim() << ", eps=" << options.eps();
  if (options.unit_offset()) stream << ", 1 + weight";
  if (strategy_) stream << ", " << strategy_->describe();
  stream << ")";
}

at::Tensor RMSNormImpl::forward(const at::Tensor& input) {
  const ParamGateScope gate(*this);
  check_materialized(weight, "shardplan::nn::RMSNorm", "weight");
  if (strategy_) return gate.out(strategy_->forward(input, weight, options));
  return gate.out(rms_norm(input, weight, options.eps(), options.unit_offset()));
}

}  // namespace nn
}  // namespace shardplan
