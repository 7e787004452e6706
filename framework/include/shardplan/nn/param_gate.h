#pragma once
// The seam through which ZeRO-3 (`data_parallel: {zero: 3}`) reaches a
// layer's parameters: C++ modules have no forward hooks, so every
// shardplan::nn layer derives from GatedLayer and opens a ParamGateScope
// first thing in its forward. Without a gate installed (no ZeRO-3) the
// scope does nothing. With one (DataParallel installs it):
//   - opening the scope makes the layer's own parameters whole
//     (all-gathered over the batch axis, or the prefetch started earlier
//     waited for);
//   - out(y) puts a hook on each output that requires a gradient, which
//     makes them whole again before backward reaches the layer's nodes
//     (autograd saves leaf parameters by reference, so they must be whole
//     when backward reads them);
//   - closing the scope frees them (each parameter keeps its shape over a
//     single NaN, stride 0; its 1/D slice lives in the DataParallel).
// A gate works the same when the forward runs again inside backward
// (activation recomputation).
//
// A custom layer takes part the same way: derive from GatedLayer, open a
// ParamGateScope at the top of forward(), and pass every returned tensor
// through out(). Its own parameters (named_parameters(recurse = false))
// are its unit; a child module is its own unit. Only the layer's forward may
// read its parameters: code that reads one elsewhere between steps reads NaN
// (DataParallel::WholeParameters makes them whole for a while).
#include <ATen/core/Tensor.h>

#include <memory>
#include <tuple>
#include <vector>

namespace shardplan {
namespace nn {

class ParamGate {
 public:
  virtual ~ParamGate() = default;
  virtual void before_forward() = 0;
  virtual void after_forward() = 0;
  virtual void before_backward() = 0;
};

class GatedLayer {
 public:
  GatedLayer() = default;
  // A clone is a new layer: it gets no gate of its own until one is installed.
  GatedLayer(const GatedLayer&) {}
  GatedLayer& operator=(const GatedLayer&) { return *this; }
  virtual ~GatedLayer() = default;
  void set_param_gate(std::shared_ptr<ParamGate> gate) { gate_ = std::move(gate); }
  const std::shared_ptr<ParamGate>& param_gate() const { return gate_; }

 private:
  std::shared_ptr<ParamGate> gate_;
};

class ParamGateScope {
 public:
  explicit ParamGateScope(const GatedLayer& layer);
  ~ParamGateScope();
  ParamGateScope(const ParamGateScope&) = delete;
  ParamGateScope& operator=(const ParamGateScope&) = delete;
  at::Tensor out(const at::Tensor& y) const;
  std::tuple<at::Tensor, at::Tensor> out(const std::tuple<at::Tensor, at::Tensor>& y) const {
    return std::make_tuple(out(std::get<0>(y)), out(std::get<1>(y)));
  }

 private:
  std::shared_ptr<ParamGate> gate_;
};

}  // namespace nn
}  // namespace shardplan
