#pragma once
// shardplan::nn::LayerNorm: torch::nn::LayerNorm with a seam for parallelism.
// Same options, parameter names ("weight", "bias"), initialisation and
// state_dict keys as torch::nn::LayerNorm, so a vanilla checkpoint loads into
// it and back. With no strategy installed its forward is torch::nn::LayerNorm's.
//
// A LayerNorm is never split (its statistics span every feature), but under
// sequence parallelism it runs on this rank's part of the sequence, so the
// gradients of its weight and bias cover only that part until they are
// all-reduced: the `layer_norm` plugin installs a strategy that does it.
#include <torch/nn/cloneable.h>
#include <torch/nn/options/normalization.h>
#include <torch/nn/pimpl.h>

#include "shardplan/nn/param_gate.h"

#include <memory>
#include <string>

namespace shardplan {
namespace nn {

class LayerNormStrategy {
 public:
  virtual ~LayerNormStrategy() = default;
  virtual at::Tensor forward(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                             const torch::nn::LayerNormOptions& options) = 0;
  virtual std::string describe() const = 0;
};

class LayerNormImpl : public torch::nn::Cloneable<LayerNormImpl>, public GatedLayer {
 public:
  LayerNormImpl(std::vector<int64_t> normalized_shape)
      : LayerNormImpl(torch::nn::LayerNormOptions(std::move(normalized_shape))) {}
  explicit LayerNormImpl(torch::nn::LayerNormOptions options_);

  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& input);

  void set_strategy(std::shared_ptr<LayerNormStrategy> strategy) { strategy_ = std::move(strategy); }
  const std::shared_ptr<LayerNormStrategy>& strategy() const { return strategy_; }

  torch::nn::LayerNormOptions options;
  at::Tensor weight;
  at::Tensor bias;

 private:
  std::shared_ptr<LayerNormStrategy> strategy_;
};

TORCH_MODULE(LayerNorm);

}  // namespace nn
}  // namespace shardplan
