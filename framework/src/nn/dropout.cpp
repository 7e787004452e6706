#include "shardplan/nn/dropout.h"

#include <ostream>

#include "shardplan/random.h"

namespace shardplan {
namespace nn {

DropoutImpl::DropoutImpl(const torch::nn::DropoutOptions& options_) : options(options_) { reset(); }

void DropoutImpl::reset() {
  TORCH_CHECK(options.p() >= 0. && options.p() <= 1., "dropout probability has to be between 0 and 1, but got ",
              options.p());
}

void DropoutImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "shardplan::nn::Dropout(p=" << options.p() << ", inplace=" << options.inplace();
  if (!sharded_axis.empty()) stream << ", sharded over " << sharded_axis;
  stream << ")";
}

at::Tensor DropoutImpl::forward(at::Tensor input) {
  if (sharded_axis.empty()) return shardplan::dropout(input, options.p(), is_training(), options.inplace());
  RngFork fork(sharded_axis);
  return shardplan::dropout(input, options.p(), is_training(), options.inplace());
}

}  // namespace nn
}  // namespace shardplan
