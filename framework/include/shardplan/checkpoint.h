#pragma once
// Saving and loading a tensor-parallel model (docs/CHECKPOINTS.md).
//
// Full state dicts: collect_state_dict gathers every sharded parameter into
// the whole tensor under its original name, so torch::save of it loads into
// the plain torch::nn model; relocate_state_dict cuts a whole state dict into
// this rank's shards. Sharded checkpoints: every rank writes its own pieces
// and rank 0 one metadata file; loading reshards to any world size and plan
// whose global shapes agree. Both work from the ParallelReport that
// parallelize() returned, whose rows say how every parameter was cut.
#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/parallelize.h"

namespace torch {
namespace nn {
class Module;
}
namespace optim {
class Optimizer;
}
}  // namespace torch

namespace shardplan {

class World;

// Parameters then buffers, in named_parameters() / named_buffers() order.
using StateDict = std::vector<std::pair<std::string, at::Tensor>>;

// This rank's tensors (parameters and buffers, shards as they are).
StateDict local_state_dict(torch::nn::Module& model);

// The whole tensors, on `root` (other ranks get an empty dict) or on every
// rank when root < 0. Collective over `world`.
StateDict collect_state_dict(torch::nn::Module& model, const ParallelReport& report, World& world, int root = 0);

// This rank's shard of every tensor of a whole state dict (as collected, or
// as the plain model's), ready for load_state_dict. Throws shardplan::Error
// naming the first tensor that is missing or has another shape.
StateDict relocate_state_dict(const StateDict& full, const ParallelReport& report);

// Copies `state` into the model's parameters and buffers, which must all be
// present with the same shapes (error names the first that is not).
void load_state_dict(torch::nn::Module& model, const StateDict& state);

struct CheckpointOptions {
  // Its per-parameter state (SGD momentum, Adam/AdamW moments and step) is
  // saved and resharded with the parameters. Must be built over
  // model.parameters() (the order is how states are matched to names).
  torch::optim::Optimizer* optimizer = nullptr;
  // Free-form values kept in the metadata (e.g. "step": "200").
  std::map<std::string, std::string> attributes;
};

// Collective. Writes `dir` atomically: pieces and metadata go to
// "<dir>.partial", which then replaces `dir` in one rename, so a failure at
// any point leaves the previous checkpoint as it was. Every rank must see
// the same filesystem.
void save_checkpoint(const std::string& dir, torch::nn::Module& model, const ParallelReport& report, World& world,
                     const CheckpointOptions& options = {});

// Collective. Loads a checkpoint written at any world size and plan into this
// model (sharded by `report`), verifying checksums; errors name the tensor and
// the file. Returns the checkpoint's attributes.
std::map<std::string, std::string> load_checkpoint(const std::string& dir, torch::nn::Module& model,
                                                   const ParallelReport& report, World& world,
                                                   const CheckpointOptions& options = {});

}  // namespace shardplan
