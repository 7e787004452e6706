#pragma once
// shardplan::nn::Linear: torch::nn::Linear with a seam for parallelism.
// Same options, parameter names ("weight", "bias"), initialisation and
// state_dict keys as torch::nn::Linear, so a vanilla checkpoint loads into it
// and back. With no strategy installed its forward is torch::nn::Linear's.
// parallelize() installs a LinearStrategy from a layer plugin.
#include <torch/nn/cloneable.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/pimpl.h>

#include "shardplan/nn/param_gate.h"

#include <memory>
#include <string>

namespace shardplan {

class Communicator;

namespace nn {

// How a Linear computes with its (possibly sharded) weight and bias.
class LinearStrategy {
 public:
  virtual ~LinearStrategy() = default;
  virtual at::Tensor forward(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias) = 0;
  virtual std::string describe() const = 0;  // "column-parallel over 'model' (2), output gathered"
  // The group whose ranks each expect their own slice of the input's last dim
  // (row-parallel with `input: sharded`), or nullptr when the input comes
  // whole. A layer that feeds this Linear from activations it holds split
  // (MultiheadAttention's heads into out_proj) asks, to hand them over as
  // they are or gather them first.
  virtual Communicator* sharded_input_group() const { return nullptr; }
  // The group over whose ranks the output's last dim is left split
  // (column-parallel with `output: sharded`), or nullptr when every rank gets
  // the whole output. A caller that needs the whole output after all (an LM
  // head's logits for sampling) gathers over it.
  virtual Communicator* sharded_output_group() const { return nullptr; }
};

class LinearImpl : public torch::nn::Cloneable<LinearImpl>, public GatedLayer {
 public:
  LinearImpl(int64_t in_features, int64_t out_features)
      : LinearImpl(torch::nn::LinearOptions(in_features, out_features)) {}
  explicit LinearImpl(const torch::nn::LinearOptions& options_);

  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& input);

  void set_strategy(std::shared_ptr<LinearStrategy> strategy) { strategy_ = std::move(strategy); }
  const std::shared_ptr<LinearStrategy>& strategy() const { return strategy_; }

  torch::nn::LinearOptions options;
  at::Tensor weight;
  at::Tensor bias;
  // The attention heads this Linear's features are made of, as the model
  // knows them: a query/key/value projection's out_features are heads of
  // `out_head_dim` rows, an output projection's in_features heads of
  // `in_head_dim` columns; 0: not heads, or the model does not say. Layer
  // plugins check a plan's head size against it (and take it from here when
  // the plan leaves it to the model), since a plan that cuts heads of another
  // size than the model computes with gives wrong numbers, not an error.
  int64_t out_head_dim = 0;
  int64_t in_head_dim = 0;

 private:
  std::shared_ptr<LinearStrategy> strategy_;
};

TORCH_MODULE(Linear);

}  // namespace nn
}  // namespace shardplan
