#include "shardplan/nn/param_gate.h"

#include <ATen/core/Tensor.h>

namespace shardplan {
namespace nn {

ParamGateScope::ParamGateScope(const GatedLayer& layer) : gate_(layer.param_gate()) {
  if (gate_) gate_->before_forward();
}

// Not noexcept(false): a gate that cannot free is no reason to lose the
// forward's own exception; freeing is a local set_data.
ParamGateScope::~ParamGateScope() {
  if (gate_) gate_->after_forward();
}

// A hook on a non-leaf output runs before its grad_fn, i.e. before any node
// of this layer's forward that leads to that output: the parameters are whole
// when the first of them reads its saved leaves.
at::Tensor ParamGateScope::out(const at::Tensor& y) const {
  if (!gate_ || !y.defined() || !y.requires_grad()) return y;
  std::weak_ptr<ParamGate> weak = gate_;
  y.register_hook([weak](const at::Tensor&) {
    if (auto g = weak.lock()) g->before_backward();
  });
  return y;
}

}  // namespace nn
}  // namespace shardplan
