#pragma once
// shardplan::nn::LSTM: torch::nn::LSTM with a seam for parallelism. Same
// options (torch::nn::LSTMOptions), parameter names ("weight_ih_l0",
// "bias_hh_l1_reverse", ...), initialisation, state_dict keys and forward
// (output, (h_n, c_n)) as torch::nn::LSTM, so a vanilla checkpoint loads into
// it and back. With no strategy installed its forward is torch::nn::LSTM's
// (one at::lstm call with the same flat weights), except that inter-layer
// dropout in training draws from the thread's RNG tracker when one is current
// (shardplan/random.h), so a replicated LSTM gets the same masks on every
// rank. parallelize() installs an LSTMStrategy from a layer plugin.
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any_value.h>
#include <torch/nn/options/rnn.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace shardplan {
namespace nn {

class LSTMImpl;

// (output, (h_n, c_n)), as torch::nn::LSTM returns it.
using LSTMOutput = std::tuple<at::Tensor, std::tuple<at::Tensor, at::Tensor>>;

// How an LSTM computes with its (possibly sharded) weights. `hx` has been
// checked against the module's options (full, unsharded shapes).
class LSTMStrategy {
 public:
  virtual ~LSTMStrategy() = default;
  virtual LSTMOutput forward(const LSTMImpl& lstm, const at::Tensor& input,
                             const std::tuple<at::Tensor, at::Tensor>& hx) = 0;
  virtual std::string describe() const = 0;  // "hidden-parallel over 'model' (2)"
};

class LSTMImpl : public torch::nn::Cloneable<LSTMImpl> {
 public:
  LSTMImpl(int64_t input_size, int64_t hidden_size) : LSTMImpl(torch::nn::LSTMOptions(input_size, hidden_size)) {}
  explicit LSTMImpl(const torch::nn::LSTMOptions& options_);

  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  // torch::nn::LSTM re-caches its flat weights after a move; so do we, and on
  // CUDA lays them out for cuDNN the same way.
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;
  void flatten_parameters();

  LSTMOutput forward(const at::Tensor& input, torch::optional<std::tuple<at::Tensor, at::Tensor>> hx_opt = {});

  // Parameters in at::lstm's order: per layer, per direction, w_ih, w_hh
  // (b_ih, b_hh when bias, w_hr when proj_size > 0).
  const std::vector<at::Tensor>& flat_weights() const { return flat_weights_; }
  const std::vector<std::string>& flat_weights_names() const { return flat_weights_names_; }
  // The weights of one layer and direction (0 forward, 1 reverse), in the
  // same order.
  std::vector<at::Tensor> layer_weights(int64_t layer, int64_t direction) const;

  void set_strategy(std::shared_ptr<LSTMStrategy> strategy) { strategy_ = std::move(strategy); }
  const std::shared_ptr<LSTMStrategy>& strategy() const { return strategy_; }

  torch::nn::LSTMOptions options;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(torch::optional<std::tuple<at::Tensor, at::Tensor>>())})

 private:
  void reset_flat_weights();
  void check_forward_args(const at::Tensor& input, const std::tuple<at::Tensor, at::Tensor>& hx) const;
  LSTMOutput forward_layerwise(const at::Tensor& input, const std::tuple<at::Tensor, at::Tensor>& hx);

  std::vector<std::string> flat_weights_names_;
  std::vector<at::Tensor> flat_weights_;
  std::shared_ptr<LSTMStrategy> strategy_;
};

TORCH_MODULE(LSTM);

}  // namespace nn
}  // namespace shardplan
