// Sharded checkpoints of TorchScript modules: the tensors come from the
// module's slots instead of a torch::nn::Module, and everything else (pieces,
// metadata, resharding, optimizer state) is checkpoint.cpp's.
#include <torch/script.h>

#include "shardplan/checkpoint.h"
#include "checkpoint_internal.h"

namespace shardplan {

ckpt_detail::ModelTensors ckpt_detail::model_tensors(const torch::jit::Module& model) {
  ModelTensors m;
  for (const auto& p : model.named_parameters()) m.parameters.emplace_back(p.name, p.value);
  for (const auto& b : model.named_buffers()) m.buffers.emplace_back(b.name, b.value);
  for (const auto& s : model.named_modules()) {
    if (!s.name.empty()) m.modules.push_back(s.name);  // the root comes first, named ""
  }
  return m;
}

StateDict collect_gradients(const torch::jit::Module& model, const ParallelReport& report, World& world, int root) {
  return ckpt_detail::collect_gradients(ckpt_detail::inventory(ckpt_detail::model_tensors(model), report), report,
                                        world, root);
}

void save_checkpoint(const std::string& dir, torch::jit::Module& model, const ParallelReport& report, World& world,
                     const CheckpointOptions& options) {
  ckpt_detail::save_model_checkpoint(dir, ckpt_detail::model_tensors(model), report, world, options);
}

std::map<std::string, std::string> load_checkpoint(const std::string& dir, torch::jit::Module& model,
                                                   const ParallelReport& report, World& world,
                                                   const CheckpointOptions& options) {
  return ckpt_detail::load_model_checkpoint(dir, ckpt_detail::model_tensors(model), report, world, options);
}

}  // namespace shardplan
