#pragma once
// shardplan::nn::RMSNorm: root-mean-square layer normalisation,
//   y = x * rsqrt(mean(x^2 over the last dim) + eps) * weight,
// the twin of Hugging Face's LlamaRMSNorm (transformers, modeling_llama.py),
// which torch.nn.RMSNorm (PyTorch 2.4+) matches in its parameter ("weight",
// ones) and state_dict key. libtorch 1.13 has no RMSNorm module, so there is
// no torch::nn class to mirror; the arithmetic is LlamaRMSNorm's: statistics
// in float32 when the input is float16/bfloat16 (a mean of squares overflows
// or loses the small ones there), the normalised value cast back to the
// input's dtype before the weight multiplies it. float32 and float64 inputs
// are computed in their own dtype, so float64 tests stay exact.
//
// Like LayerNorm it is never split (its statistic spans every feature), but
// under sequence parallelism it runs on this rank's part of the sequence, so
// its weight gradient covers only that part until it is all-reduced: the
// `layer_norm` plugin installs the strategy that does it.
#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include "shardplan/nn/param_gate.h"

#include <cstdint>
#include <memory>
#include <string>

namespace shardplan {
namespace nn {

struct RMSNormOptions {
  explicit RMSNormOptions(int64_t dim) : dim_(dim) {}
  // Size of the last dim, the one normalised.
  RMSNormOptions& dim(int64_t v) { dim_ = v; return *this; }
  int64_t dim() const { return dim_; }
  // LlamaRMSNorm's default; Llama checkpoints' config.json gives rms_norm_eps.
  RMSNormOptions& eps(double v) { eps_ = v; return *this; }
  double eps() const { return eps_; }
  // Gemma's RMSNorm: x * (1 + weight), in float32 for float16/bfloat16 and
  // cast back after the product; the weight (what checkpoints store) starts
  // at zero.
  RMSNormOptions& unit_offset(bool v) { unit_offset_ = v; return *this; }
  bool unit_offset() const { return unit_offset_; }

 private:
  int64_t dim_;
  double eps_ = 1e-6;
  bool unit_offset_ = false;
};

// The function itself (no module): what the module and its strategies call.
at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps, bool unit_offset = false);

class RMSNormStrategy {
 public:
  virtual ~RMSNormStrategy() = default;
  virtual at::Tensor forward(const at::Tensor& input, const at::Tensor& weight, const RMSNormOptions& options) = 0;
  virtual std::string describe() const = 0;
};

class RMSNormImpl : public torch::nn::Cloneable<RMSNormImpl>, public GatedLayer {
 public:
  explicit RMSNormImpl(int64_t dim) : RMSNormImpl(RMSNormOptions(dim)) {}
  explicit RMSNormImpl(const RMSNormOptions& options_);

  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;
  // input [..., dim]
  at::Tensor forward(const at::Tensor& input);

  void set_strategy(std::shared_ptr<RMSNormStrategy> strategy) { strategy_ = std::move(strategy); }
  const std::shared_ptr<RMSNormStrategy>& strategy() const { return strategy_; }

  RMSNormOptions options;
  at::Tensor weight;

 private:
  std::shared_ptr<RMSNormStrategy> strategy_;
};

TORCH_MODULE(RMSNorm);

}  // namespace nn
}  // namespace shardplan
