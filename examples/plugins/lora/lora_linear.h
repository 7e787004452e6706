#pragma once
// LoRALinear: a user-side layer, not part of shardplan. A frozen base
// (weight [out, in], bias [out]) plus a trainable low-rank adapter
// (lora_A [r, in], lora_B [out, r]) scaled by alpha / r:
//
//   y = x W^T + b + (alpha / r) * (x A^T) B^T
//
// It has the same kind of seam as shardplan::nn::Linear (a strategy the
// layer plugin installs), so the module knows nothing about parallelism and
// the plugin (lora_plugin.cpp) knows nothing about training. It lives in its
// own shared library, which both the program and the plugin link: the
// plugin's dynamic_cast and the program's objects then see one type.
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <vector>

#include "shardplan/checkpoint.h"

namespace shardplan {
class World;
}

namespace lora {

// How a LoRALinear computes with its (possibly sharded) tensors. `a` and `b`
// are undefined once the adapter is merged into the base.
class LoRAStrategy {
 public:
  virtual ~LoRAStrategy() = default;
  virtual at::Tensor forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             const at::Tensor& a, const at::Tensor& b, double scale) = 0;
  virtual std::string describe() const = 0;
};

class LoRALinearImpl : public torch::nn::Cloneable<LoRALinearImpl> {
 public:
  LoRALinearImpl(int64_t in_features, int64_t out_features, int64_t r, double alpha, bool with_bias = true);

  // Base as torch::nn::Linear initialises it; lora_A small and random,
  // lora_B zero, so a fresh adapter leaves the output unchanged.
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& x);

  // W += scale * B A on the tensors this rank holds, then the adapter is
  // left out of forward. Every plan the plugin accepts pairs the shards so
  // that this is this rank's shard of the unsharded merge (column-parallel:
  // rows of W and B; row-parallel: columns of W and A), so no communication.
  void merge();
  bool merged() const { return merged_; }
  double scale() const { return alpha / static_cast<double>(r); }

  void set_strategy(std::shared_ptr<LoRAStrategy> strategy) { strategy_ = std::move(strategy); }
  const std::shared_ptr<LoRAStrategy>& strategy() const { return strategy_; }

  int64_t in_features, out_features, r;
  double alpha;
  bool with_bias;
  at::Tensor weight, bias, lora_A, lora_B;

 private:
  bool merged_ = false;
  std::shared_ptr<LoRAStrategy> strategy_;
};

TORCH_MODULE(LoRALinear);

// Whether a parameter path names an adapter tensor ("...lora_A", "...lora_B").
bool is_adapter(const std::string& path);

// Sets requires_grad false on every parameter that is not an adapter and
// returns the adapters, the tensors to hand an optimizer.
std::vector<at::Tensor> freeze_base(torch::nn::Module& model);

// The whole adapter tensors alone (collect_state_dict filtered by name), on
// `root` (others: empty). Collective over `world`. torch::save it, or
// write it with save_adapters.
shardplan::StateDict adapter_state_dict(torch::nn::Module& model, const shardplan::ParallelReport& report,
                                        shardplan::World& world, int root = 0);

// Files of whole adapters: one tensor per name, readable at any world size.
void save_adapters(const shardplan::StateDict& adapters, const std::string& file);
shardplan::StateDict read_adapters(const std::string& file);

// Cuts whole adapters into this rank's shards (relocate_state_dict with the
// model's report) and copies them in; every adapter of the model must be
// there. The base is untouched.
void load_adapters(torch::nn::Module& model, const shardplan::ParallelReport& report,
                   const shardplan::StateDict& adapters);

}  // namespace lora
