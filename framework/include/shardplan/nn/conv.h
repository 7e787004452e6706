#pragma once
// shardplan::nn::Conv1d/Conv2d/Conv3d: torch::nn::ConvNd with a seam for
// parallelism. Same options (torch::nn::ConvOptions<D>), parameter names
// ("weight", "bias"), initialisation, state_dict keys and forward as
// torch::nn::ConvNd, so a vanilla checkpoint loads into it and back. With no
// strategy installed its forward is torch::nn::ConvNd's. parallelize()
// installs a ConvStrategy from a layer plugin.
#include <torch/nn/cloneable.h>
#include <torch/nn/options/conv.h>
#include <torch/nn/pimpl.h>

#include "shardplan/nn/param_gate.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace shardplan {
namespace nn {

// The module's own convolution (padding, padding mode, stride, dilation)
// applied to the given tensors; `groups` is passed separately because a shard
// of a grouped convolution holds fewer groups than the module.
using ConvFunction = std::function<at::Tensor(const at::Tensor& input, const at::Tensor& weight,
                                              const at::Tensor& bias, int64_t groups)>;

// How a ConvNd computes with its (possibly sharded) weight and bias. One
// interface for every D: the spatial dims only matter inside `conv`.
class ConvStrategy {
 public:
  virtual ~ConvStrategy() = default;
  virtual at::Tensor forward(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                             const ConvFunction& conv) = 0;
  virtual std::string describe() const = 0;  // "output-channel parallel over 'model' (2), output gathered"
};

template <size_t D, typename Derived>
class ConvNdImpl : public torch::nn::Cloneable<Derived>, public GatedLayer {
 public:
  explicit ConvNdImpl(const torch::nn::ConvOptions<D>& options_);

  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& input);
  // torch::nn::ConvNd's forward with these tensors and group count.
  at::Tensor convolve(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                      int64_t groups) const;

  void set_strategy(std::shared_ptr<ConvStrategy> strategy) { strategy_ = std::move(strategy); }
  const std::shared_ptr<ConvStrategy>& strategy() const { return strategy_; }

  torch::nn::ConvOptions<D> options;
  at::Tensor weight;
  at::Tensor bias;

 protected:
  std::vector<int64_t> _reversed_padding_repeated_twice;

 private:
  std::shared_ptr<ConvStrategy> strategy_;
};

// Distinct classes (not aliases of the template) because layer plugins are
// found by the module's demangled type name: "shardplan::nn::Conv2dImpl".
class Conv1dImpl : public ConvNdImpl<1, Conv1dImpl> {
 public:
  Conv1dImpl(int64_t input_channels, int64_t output_channels, torch::ExpandingArray<1> kernel_size)
      : Conv1dImpl(torch::nn::Conv1dOptions(input_channels, output_channels, kernel_size)) {}
  explicit Conv1dImpl(const torch::nn::Conv1dOptions& options_) : ConvNdImpl(options_) {}
  at::Tensor forward(const at::Tensor& input) { return ConvNdImpl::forward(input); }
};

class Conv2dImpl : public ConvNdImpl<2, Conv2dImpl> {
 public:
  Conv2dImpl(int64_t input_channels, int64_t output_channels, torch::ExpandingArray<2> kernel_size)
      : Conv2dImpl(torch::nn::Conv2dOptions(input_channels, output_channels, kernel_size)) {}
  explicit Conv2dImpl(const torch::nn::Conv2dOptions& options_) : ConvNdImpl(options_) {}
  at::Tensor forward(const at::Tensor& input) { return ConvNdImpl::forward(input); }
};

class Conv3dImpl : public ConvNdImpl<3, Conv3dImpl> {
 public:
  Conv3dImpl(int64_t input_channels, int64_t output_channels, torch::ExpandingArray<3> kernel_size)
      : Conv3dImpl(torch::nn::Conv3dOptions(input_channels, output_channels, kernel_size)) {}
  explicit Conv3dImpl(const torch::nn::Conv3dOptions& options_) : ConvNdImpl(options_) {}
  at::Tensor forward(const at::Tensor& input) { return ConvNdImpl::forward(input); }
};

// Members are defined in conv.cpp, for these three only.
extern template class ConvNdImpl<1, Conv1dImpl>;
extern template class ConvNdImpl<2, Conv2dImpl>;
extern template class ConvNdImpl<3, Conv3dImpl>;

TORCH_MODULE(Conv1d);
TORCH_MODULE(Conv2d);
TORCH_MODULE(Conv3d);

}  // namespace nn
}  // namespace shardplan
