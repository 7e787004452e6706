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
namespace jit {
struct Module;
}
namespace optim {
class Optimizer;
}
}  // namespace torch

namespace shardplan {

class World;
class ZeroOptimizer;

// Parameters then buffers, in named_parameters() / named_buffers() order.
using StateDict = std::vector<std::pair<std::string, at::Tensor>>;

// This rank's tensors (parameters and buffers, shards as they are).
StateDict local_state_dict(torch::nn::Module& model);

// The whole tensors, on `root` (other ranks get an empty dict) or on every
// rank when root < 0. Collective over `world`.
StateDict collect_state_dict(torch::nn::Module& model, const ParallelReport& report, World& world, int root = 0);
// The same from this rank's state dict instead of a torch::nn::Module (a
// TorchScript module's, shardplan/script.h's script_state_dict): tensors the
// report does not cut are taken as they are.
StateDict collect_state_dict(const StateDict& local, const ParallelReport& report, World& world, int root = 0);

// The whole gradient of every parameter, by name, as one process would hold
// it after backward (to log or check them): gathered like
// collect_state_dict, on `root` or on every rank when root < 0. A parameter
// no rank has a gradient for is left out. Under data parallelism, call it
// after the gradients are averaged. Collective over `world`. The tensors are
// copies: the next backward does not change them.
StateDict collect_gradients(torch::nn::Module& model, const ParallelReport& report, World& world, int root = 0);
// The same for a TorchScript module sharded by parallelize_script (its
// ScriptParallel's module and report); a tied tensor under each of its paths.
StateDict collect_gradients(const torch::jit::Module& model, const ParallelReport& report, World& world,
                            int root = 0);

// This rank's shard of every tensor of a whole state dict (as collected, or
// as the plain model's), ready for load_state_dict. Throws shardplan::Error
// naming the first tensor that is missing or has another shape.
StateDict relocate_state_dict(const StateDict& full, const ParallelReport& report);

// Copies `state` into the model's parameters and buffers, which must all be
// present with the same shapes (error names the first that is not).
void load_state_dict(torch::nn::Module& model, const StateDict& state);

struct CheckpointOptions {
  // Its per-parameter state (SGD, Adam, AdamW, RMSprop, Adagrad) is
  // saved and resharded with the parameters. Must be built over
  // the model's parameter tensors: model.parameters(), or unique_parameters(model)
  // for tied weights (states are matched to names by the tensor, in any order).
  torch::optim::Optimizer* optimizer = nullptr;
  // Instead of `optimizer`, with data_parallel.zero: ZeRO-1's slices of the
  // state are saved as the same per-parameter tensors a plain optimizer's
  // would be (gathered over the batch axis, written once), and loading cuts
  // them into this rank's slices. So either kind loads into the other, at
  // any batch-axis size. Its inner optimizer must be SGD, Adam or AdamW.
  ZeroOptimizer* zero = nullptr;
  // Master weights (shardplan::Optimizer with MixedPrecision::master_dtype;
  // its checkpoint_options() sets them): (model parameter, its master). The
  // masters are saved as the parameters' values, in their dtype, and the
  // optimizer state is keyed by them (`optimizer` is built over them);
  // loading fills the masters and rounds them into the model. A checkpoint
  // whose parameters have a narrower dtype than the masters (saved without
  // masters) is refused. With `zero`, its masters (ZeroOptimizer::masters())
  // are handled the same way and this stays empty.
  std::vector<std::pair<at::Tensor, at::Tensor>> masters;
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
// model (sharded by `report`; a default ParallelReport describes an unsharded
// model), verifying checksums; errors name the tensor and the file. Reads and
// checks everything on every rank before any rank changes its model or
// optimizer, so a failed load leaves them as they were. Returns the
// checkpoint's attributes.
std::map<std::string, std::string> load_checkpoint(const std::string& dir, torch::nn::Module& model,
                                                   const ParallelReport& report, World& world,
                                                   const CheckpointOptions& options = {});

// The same for a TorchScript module sharded by parallelize_script (its
// ScriptParallel's module and report), in the same format: one saved at
// any world size and plan loads into the module unsharded or sharded.
void save_checkpoint(const std::string& dir, torch::jit::Module& model, const ParallelReport& report, World& world,
                     const CheckpointOptions& options = {});
std::map<std::string, std::string> load_checkpoint(const std::string& dir, torch::jit::Module& model,
                                                   const ParallelReport& report, World& world,
                                                   const CheckpointOptions& options = {});

// Offline, with no model and no world (`shardplan ckpt convert`): rewrites
// checkpoint `src` as one for `world_size` ranks at `dst` (atomically, like
// save_checkpoint; dst may be src). Every tensor keeps its cuts (dims, mesh
// axes, blocks) with the parts and indices of the mesh of `plan_yaml` (by
// default the plan saved in the checkpoint) resolved for world_size.
// Checksums are verified; one whole tensor is in memory at a time.
void reshard_checkpoint(const std::string& src, const std::string& dst, int world_size,
                        const std::string& plan_yaml = "");

// The whole tensors of the model saved in a checkpoint (parameters and
// buffers, not optimizer state), in saved order, checksums verified.
// `buffers`, when given, receives the names of the buffers; `modules` the
// paths of every submodule (with or without tensors).
StateDict read_checkpoint(const std::string& dir, std::vector<std::string>* buffers = nullptr,
                          std::vector<std::string>* modules = nullptr);

}  // namespace shardplan
