#pragma once
// shardplan::nn::Dropout: torch::nn::Dropout drawing its mask from the rank's
// RngTracker (shardplan/random.h). Same options and (no) parameters; with no
// tracker current on the thread its forward is torch::nn::Dropout's,
// bit for bit, on torch's global generator.
//
// After parallelize() the mask comes from the tracker's replicated stream
// (identical on every rank: right for activations every rank holds whole),
// or, when sharded_axis is set (a dropout over activations split along that
// mesh axis, e.g. after a column-parallel Linear with `output: sharded`), from
// the stream sharded along it (independent per shard). An enclosing RngFork
// also selects the sharded stream.
#include <torch/nn/cloneable.h>
#include <torch/nn/options/dropout.h>
#include <torch/nn/pimpl.h>

#include <string>

namespace shardplan {
namespace nn {

class DropoutImpl : public torch::nn::Cloneable<DropoutImpl> {
 public:
  DropoutImpl(double p) : DropoutImpl(torch::nn::DropoutOptions().p(p)) {}
  explicit DropoutImpl(const torch::nn::DropoutOptions& options_ = {});

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(at::Tensor input);

  torch::nn::DropoutOptions options;
  // "" (replicated activations) or the mesh axis the input is split along.
  std::string sharded_axis;
};

TORCH_MODULE(Dropout);

}  // namespace nn
}  // namespace shardplan
