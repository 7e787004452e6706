#include "shardplan/nn/lstm.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/init.h>

#include <cmath>
#include <ostream>
#include <sstream>
#include <unordered_set>

#include "shardplan/nn/deferred_init.h"
#include "shardplan/random.h"

namespace shardplan {
namespace nn {
namespace {

// cuDNN's mode code for an LSTM (cudnnRNNMode_t), as torch::nn::LSTM passes it.
constexpr int64_t kCudnnLstmMode = 2;

std::string sizes_str(at::IntArrayRef sizes) {
  std::ostringstream os;
  os << sizes;
  return os.str();
}

}  // namespace

LSTMImpl::LSTMImpl(const torch::nn::LSTMOptions& options_) : options(options_) { reset(); }

// Mirrors torch::nn::LSTMImpl (RNNImplBase::reset): the same checks, the same
// parameters registered in the same order, then the same draws from the
// generator, so unsharded models built from either type are bit-identical.
void LSTMImpl::reset() {
  TORCH_CHECK(0 <= options.dropout() && options.dropout() <= 1, "dropout should be a number in range [0, 1] ",
              "representing the probability of an element being zeroed");
  if (options.dropout() > 0 && options.num_layers() == 1) {
    TORCH_WARN("dropout option adds dropout after all but last recurrent layer, so non-zero dropout expects ",
               "num_layers greater than 1, but got dropout=", options.dropout(), " and num_layers=",
               options.num_layers());
  }
  TORCH_CHECK(options.hidden_size() > 0, "hidden_size must be greater than zero");
  TORCH_CHECK(options.num_layers() > 0, "num_layers must be greater than zero");
  TORCH_CHECK(0 <= options.proj_size() && options.proj_size() < options.hidden_size(),
              "proj_size has to be a positive integer, smaller than hidden_size or zero to disable projections");

  const int64_t directions = options.bidirectional() ? 2 : 1;
  const int64_t gate_size = 4 * options.hidden_size();
  const int64_t real_hidden = options.proj_size() > 0 ? options.proj_size() : options.hidden_size();
  flat_weights_names_.clear();
  for (int64_t layer = 0; layer < options.num_layers(); ++layer) {
    for (int64_t direction = 0; direction < directions; ++direction) {
      const int64_t layer_input = layer == 0 ? options.input_size() : real_hidden * directions;
      const std::string suffix = std::to_string(layer) + (direction == 1 ? "_reverse" : "");
      std::vector<std::pair<std::string, std::vector<int64_t>>> params = {
          {"weight_ih_l" + suffix, {gate_size, layer_input}}, {"weight_hh_l" + suffix, {gate_size, real_hidden}}};
      if (options.bias()) {
        params.push_back({"bias_ih_l" + suffix, {gate_size}});
        params.push_back({"bias_hh_l" + suffix, {gate_size}});
      }
      if (options.proj_size() > 0)
        params.push_back({"weight_hr_l" + suffix, {options.proj_size(), options.hidden_size()}});
      for (auto& p : params) {
        register_parameter(p.first, empty_parameter(p.second));
        flat_weights_names_.push_back(p.first);
      }
    }
  }
  reset_flat_weights();
  flatten_parameters();
  if (!deferring()) reset_parameters();
}

void LSTMImpl::reset_parameters() {
  const double stdv = 1.0 / std::sqrt(static_cast<double>(options.hidden_size()));
  for (auto& weight : parameters()) torch::nn::init::uniform_(weight, -stdv, stdv);
}

void LSTMImpl::reset_flat_weights() {
  flat_weights_.clear();
  auto named = named_parameters(/*recurse=*/false);
  for (const auto& name : flat_weights_names_) {
    const at::Tensor* p = named.find(name);
    flat_weights_.push_back(p ? *p : at::Tensor());
  }
}

// As torch::nn::LSTM: on CUDA with cuDNN, give the weights one contiguous
// buffer so cuDNN need not copy them each forward; a no-op elsewhere.
void LSTMImpl::flatten_parameters() {
  if (flat_weights_.size() != flat_weights_names_.size() || flat_weights_.empty()) return;
  const auto& first = flat_weights_[0];
  for (const auto& w : flat_weights_)
    if (!w.defined() || w.dtype() != first.dtype() || !w.is_cuda() || !at::cudnn_is_acceptable(w)) return;
  std::unordered_set<void*> unique;
  for (const auto& w : flat_weights_) unique.insert(w.data_ptr());
  if (unique.size() != flat_weights_.size()) return;
  at::NoGradGuard no_grad;
  if (!at::_use_cudnn_rnn_flatten_weight()) return;
  int64_t num_weights = options.bias() ? 4 : 2;
  if (options.proj_size() > 0) ++num_weights;
  at::_cudnn_rnn_flatten_weight(flat_weights_, num_weights, options.input_size(), kCudnnLstmMode,
                                options.hidden_size(), options.proj_size(), options.num_layers(),
                                options.batch_first(), options.bidirectional());
}

void LSTMImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(device, dtype, non_blocking);
  reset_flat_weights();
  flatten_parameters();
}

void LSTMImpl::to(torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(dtype, non_blocking);
  reset_flat_weights();
  flatten_parameters();
}

void LSTMImpl::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
  reset_flat_weights();
  flatten_parameters();
}

std::vector<at::Tensor> LSTMImpl::layer_weights(int64_t layer, int64_t direction) const {
  const int64_t directions = options.bidirectional() ? 2 : 1;
  const int64_t per = static_cast<int64_t>(flat_weights_.size()) / (options.num_layers() * directions);
  const auto begin = flat_weights_.begin() + (layer * directions + direction) * per;
  return std::vector<at::Tensor>(begin, begin + per);
}

void LSTMImpl::pretty_print(std::ostream& stream) const {
  const std::string n = name();
  stream << std::boolalpha << n.substr(0, n.size() - 4) << "(input_size=" << options.input_size()
         << ", hidden_size=" << options.hidden_size() << ", num_layers=" << options.num_layers()
         << ", bias=" << options.bias() << ", batch_first=" << options.batch_first()
         << ", dropout=" << options.dropout() << ", bidirectional=" << options.bidirectional();
  if (options.proj_size() > 0) stream << ", proj_size=" << options.proj_size();
  if (strategy_) stream << ", " << strategy_->describe();
  stream << ")";
}

// torch::nn::LSTM's checks and messages (RNNImplBase::check_input,
// check_hidden_size).
void LSTMImpl::check_forward_args(const at::Tensor& input, const std::tuple<at::Tensor, at::Tensor>& hx) const {
  TORCH_CHECK(input.dim() == 3, "input must have 3 dimensions, got ", input.dim());
  TORCH_CHECK(options.input_size() == input.size(-1), "input.size(-1) must be equal to input_size. Expected ",
              options.input_size(), ", got ", input.size(-1));
  const int64_t batch = options.batch_first() ? input.size(0) : input.size(1);
  const int64_t states = options.num_layers() * (options.bidirectional() ? 2 : 1);
  const int64_t real_hidden = options.proj_size() > 0 ? options.proj_size() : options.hidden_size();
  const std::vector<int64_t> h_expected = {states, batch, real_hidden};
  const std::vector<int64_t> c_expected = {states, batch, options.hidden_size()};
  const auto& h = std::get<0>(hx);
  const auto& c = std::get<1>(hx);
  TORCH_CHECK(h.sizes() == at::IntArrayRef(h_expected), "Expected hidden[0] size ", sizes_str(h_expected), ", got ",
              sizes_str(h.sizes()));
  TORCH_CHECK(c.sizes() == at::IntArrayRef(c_expected), "Expected hidden[1] size ", sizes_str(c_expected), ", got ",
              sizes_str(c.sizes()));
}

// torch::nn::LSTMImpl::forward (forward_helper without packed sequences): zero
// states when none are given, then one at::lstm over the flat weights.
LSTMOutput LSTMImpl::forward(const at::Tensor& input, torch::optional<std::tuple<at::Tensor, at::Tensor>> hx_opt) {
  std::tuple<at::Tensor, at::Tensor> hx;
  if (!hx_opt.has_value()) {
    const int64_t directions = options.bidirectional() ? 2 : 1;
    const int64_t batch = options.batch_first() ? input.size(0) : input.size(1);
    const int64_t real_hidden = options.proj_size() > 0 ? options.proj_size() : options.hidden_size();
    auto h_zeros = torch::zeros({options.num_layers() * directions, batch, real_hidden},
                                torch::dtype(input.dtype()).device(input.device()));
    auto c_zeros = torch::zeros({options.num_layers() * directions, batch, options.hidden_size()},
                                torch::dtype(input.dtype()).device(input.device()));
    hx = std::make_tuple(h_zeros, c_zeros);
  } else {
    hx = *hx_opt;
  }
  check_forward_args(input, hx);
  for (const auto& w : flat_weights_) check_materialized(w, "shardplan::nn::LSTM", "weight");
  if (strategy_) return strategy_->forward(*this, input, hx);
  if (options.dropout() > 0 && is_training() && options.num_layers() > 1 && current_rng_tracker())
    return forward_layerwise(input, hx);
  auto result = at::lstm(input, {std::get<0>(hx), std::get<1>(hx)}, flat_weights_, options.bias(),
                         options.num_layers(), options.dropout(), is_training(), options.bidirectional(),
                         options.batch_first());
  return std::make_tuple(std::get<0>(result), std::make_tuple(std::get<1>(result), std::get<2>(result)));
}

// A replicated LSTM in a parallelized model: at::lstm would draw its
// inter-layer dropout masks from torch's global generator, a different mask on
// each rank. So one at::lstm per layer (the same per-layer computation as
// at::lstm's own loop), with the masks from the rank's RNG tracker in between.
LSTMOutput LSTMImpl::forward_layerwise(const at::Tensor& input, const std::tuple<at::Tensor, at::Tensor>& hx) {
  const int64_t layers = options.num_layers(), directions = options.bidirectional() ? 2 : 1;
  const int64_t per_layer = static_cast<int64_t>(flat_weights_.size()) / layers;
  at::Tensor x = input;
  std::vector<at::Tensor> h_n, c_n;
  for (int64_t layer = 0; layer < layers; ++layer) {
    const std::vector<at::Tensor> weights(flat_weights_.begin() + layer * per_layer,
                                          flat_weights_.begin() + (layer + 1) * per_layer);
    auto result = at::lstm(x, {std::get<0>(hx).narrow(0, layer * directions, directions),
                               std::get<1>(hx).narrow(0, layer * directions, directions)},
                           weights, options.bias(), 1, 0.0, is_training(), options.bidirectional(),
                           options.batch_first());
    x = std::get<0>(result);
    h_n.push_back(std::get<1>(result));
    c_n.push_back(std::get<2>(result));
    if (layer + 1 < layers) x = shardplan::dropout(x, options.dropout(), /*training=*/true);
  }
  return std::make_tuple(x, std::make_tuple(at::cat(h_n, 0), at::cat(c_n, 0)));
}

}  // namespace nn
}  // namespace shardplan
