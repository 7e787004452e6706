#include "shardplan/nn/conv.h"

#include <torch/enum.h>
#include <torch/nn/functional/conv.h>
#include <torch/nn/functional/padding.h>
#include <torch/nn/init.h>

#include <cmath>
#include <ostream>
#include <variant>

#include "shardplan/nn/deferred_init.h"

namespace shardplan {
namespace nn {
namespace {

namespace F = torch::nn::functional;

// The padding variant is c10::variant in libtorch 1.x and std::variant in 2.x;
// with std::get_if visible, argument-dependent lookup picks the right get_if.
template <class T, class Variant>
const T* alternative(const Variant& v) {
  using std::get_if;
  return get_if<T>(&v);
}

// Padding mode as the mode F::pad takes. By name, since the enum variants'
// namespace also differs between libtorch versions.
F::PadFuncOptions::mode_t pad_mode(const torch::nn::ConvOptions<1>::padding_mode_t& mode) {
  const std::string name = torch::enumtype::get_enum_name(mode);
  if (name == "kReflect") return torch::kReflect;
  if (name == "kReplicate") return torch::kReplicate;
  if (name == "kCircular") return torch::kCircular;
  TORCH_CHECK(false, "unsupported padding_mode ", name);
}

template <size_t D>
at::Tensor conv_nd(const at::Tensor& x, const at::Tensor& w, const F::ConvFuncOptions<D>& o) {
  if constexpr (D == 1) return F::conv1d(x, w, o);
  else if constexpr (D == 2) return F::conv2d(x, w, o);
  else return F::conv3d(x, w, o);
}

}  // namespace

template <size_t D, typename Derived>
ConvNdImpl<D, Derived>::ConvNdImpl(const torch::nn::ConvOptions<D>& options_) : options(options_) {
  reset();
}

// Mirrors torch::nn::ConvNdImpl::reset so both draw the same numbers from the
// same generator: unsharded models built from either type are bit-identical.
template <size_t D, typename Derived>
void ConvNdImpl<D, Derived>::reset() {
  TORCH_CHECK(options.in_channels() % options.groups() == 0, "in_channels must be divisible by groups");
  TORCH_CHECK(options.out_channels() % options.groups() == 0, "out_channels must be divisible by groups");

  const auto& padding = options.padding();
  _reversed_padding_repeated_twice.assign(2 * D, 0);
  if (alternative<torch::enumtype::kSame>(padding)) {
    for (size_t i = 0; i < D; ++i)
      TORCH_CHECK((*options.stride())[i] == 1, "padding='same' is not supported for strided convolutions");
    // Indexed by i, not D - 1 - i, exactly as libtorch's C++ ConvNdImpl
    // does; only non-zero padding modes with unequal kernel dims see it.
    for (size_t i = 0; i < D; ++i) {
      const int64_t total = (*options.dilation())[i] * ((*options.kernel_size())[i] - 1);
      _reversed_padding_repeated_twice[2 * i] = total / 2;
      _reversed_padding_repeated_twice[2 * i + 1] = total - total / 2;
    }
  } else if (const auto* pad = alternative<torch::ExpandingArray<D>>(padding)) {
    for (size_t i = 0; i < D; ++i) {
      _reversed_padding_repeated_twice[2 * i] = (**pad)[D - 1 - i];
      _reversed_padding_repeated_twice[2 * i + 1] = (**pad)[D - 1 - i];
    }
  }

  std::vector<int64_t> weight_sizes = {options.out_channels(), options.in_channels() / options.groups()};
  weight_sizes.insert(weight_sizes.end(), (*options.kernel_size()).begin(), (*options.kernel_size()).end());
  weight = this->register_parameter("weight", empty_parameter(weight_sizes));
  if (options.bias()) {
    bias = this->register_parameter("bias", empty_parameter({options.out_channels()}));
  } else {
    bias = this->register_parameter("bias", {}, /*requires_grad=*/false);
  }
  if (!deferring()) reset_parameters();
}

template <size_t D, typename Derived>
void ConvNdImpl<D, Derived>::reset_parameters() {
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
  if (bias.defined()) {
    int64_t fan_in, fan_out;
    std::tie(fan_in, fan_out) = torch::nn::init::_calculate_fan_in_and_fan_out(weight);
    const auto bound = 1 / std::sqrt(fan_in);
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

template <size_t D, typename Derived>
void ConvNdImpl<D, Derived>::pretty_print(std::ostream& stream) const {
  stream << "shardplan::nn::Conv" << D << "d(" << options.in_channels() << ", " << options.out_channels()
         << ", kernel_size=" << options.kernel_size() << ", stride=" << options.stride();
  const auto& padding = options.padding();
  if (alternative<torch::enumtype::kValid>(padding)) {
    stream << ", padding='valid'";
  } else if (alternative<torch::enumtype::kSame>(padding)) {
    stream << ", padding='same'";
  } else if (const auto* pad = alternative<torch::ExpandingArray<D>>(padding)) {
    if (**pad != *torch::ExpandingArray<D>(0)) stream << ", padding=" << *pad;
  }
  if (*options.dilation() != *torch::ExpandingArray<D>(1)) stream << ", dilation=" << options.dilation();
  if (options.groups() != 1) stream << ", groups=" << options.groups();
  if (!options.bias()) stream << ", bias=" << std::boolalpha << false;
  const std::string mode = torch::enumtype::get_enum_name(options.padding_mode());
  if (mode != "kZeros") stream << ", padding_mode=" << mode;
  if (strategy_) stream << ", " << strategy_->describe();
  stream << ")";
}

// torch::nn::ConvNdImpl's forward: a non-zero padding mode pads explicitly,
// then convolves without padding.
template <size_t D, typename Derived>
at::Tensor ConvNdImpl<D, Derived>::convolve(const at::Tensor& input, const at::Tensor& w, const at::Tensor& b,
                                            int64_t groups) const {
  auto o = F::ConvFuncOptions<D>().bias(b).stride(options.stride()).dilation(options.dilation()).groups(groups);
  if (torch::enumtype::get_enum_name(options.padding_mode()) != "kZeros") {
    const auto pad = F::PadFuncOptions(_reversed_padding_repeated_twice).mode(pad_mode(options.padding_mode()));
    auto padded = F::pad(input, pad);
    return conv_nd<D>(padded, w, o.padding(0));
  }
  return conv_nd<D>(input, w, o.padding(options.padding()));
}

template <size_t D, typename Derived>
at::Tensor ConvNdImpl<D, Derived>::forward(const at::Tensor& input) {
  const ParamGateScope gate(*this);
  check_materialized(weight, "shardplan::nn::Conv", "weight");
  check_materialized(bias, "shardplan::nn::Conv", "bias");
  if (strategy_) {
    return gate.out(strategy_->forward(input, weight, bias,
                                       [this](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                                              int64_t groups) { return convolve(x, w, b, groups); }));
  }
  return gate.out(convolve(input, weight, bias, options.groups()));
}

template class ConvNdImpl<1, Conv1dImpl>;
template class ConvNdImpl<2, Conv2dImpl>;
template class ConvNdImpl<3, Conv3dImpl>;

}  // namespace nn
}  // namespace shardplan
