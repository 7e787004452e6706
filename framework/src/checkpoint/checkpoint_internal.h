#pragma once
// What checkpoint.cpp (saving, loading with a world),
// checkpoint_state_dict.cpp (state dicts without files),
// checkpoint_optimizer.cpp (optimizer state) and checkpoint_offline.cpp
// (reading pieces back, resharding) share. Not installed.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/checkpoint.h"
#include "shardplan/checkpoint_meta.h"
#include "shardplan/mesh.h"
#include "shardplan/parallelize.h"
#include "shardplan/split.h"

namespace torch::nn {
class Module;
}

namespace torch::jit {
struct Module;
}

namespace torch::optim {
class Optimizer;
}

namespace shardplan {
class World;
class ZeroOptimizer;
}

namespace shardplan::ckpt_detail {

// Everything a checkpoint holds for one tensor of this rank.
struct Item {
  std::string name;
  at::Tensor local;                  // this rank's piece, as the model holds it (detached)
  at::Tensor param;                  // the parameter itself: optimizer states are keyed by it
  std::vector<int64_t> global_shape;
  std::vector<ShardSplit> splits;    // how `local` was cut; empty: whole
  std::string layout;
  bool buffer = false;
  at::Tensor model;  // with master weights: the model's parameter, `local` being its master
  bool written = true;  // false: a copy another rank writes (a tensor tied across pipeline stages)
};

// The report's rows by path: how each tensor of the model was cut.
std::map<std::string, const ReportRow*> rows_by_path(const ParallelReport& report);
// What a checkpoint reads of a model, whichever kind: a torch::nn::Module
// or a TorchScript module sharded by parallelize_script.
struct ModelTensors {
  std::vector<std::pair<std::string, at::Tensor>> parameters, buffers;  // this rank's, not detached
  std::vector<std::string> modules;                                     // every submodule's path
  // A pipelined model's part (shardplan/pipeline_checkpoint.h): the ranks of
  // `apart_axis` hold different tensors, each writing its own (writes_piece
  // leaves that axis out), and `copies` are held here but written elsewhere.
  std::string apart_axis;
  std::set<std::string> copies;
};
ModelTensors model_tensors(torch::nn::Module& model);
ModelTensors model_tensors(const torch::jit::Module& model);

// The model's parameters, then its buffers, with how the report cut them.
std::vector<Item> inventory(const ModelTensors& model, const ParallelReport& report);
std::vector<Item> inventory(torch::nn::Module& model, const ParallelReport& report);

// collect_gradients for either kind of model (its inventory).
StateDict collect_gradients(std::vector<Item> items, const ParallelReport& report, World& world, int root);

// save_checkpoint and load_checkpoint for either kind of model.
void save_model_checkpoint(const std::string& dir, const ModelTensors& model, const ParallelReport& report,
                           World& world, const CheckpointOptions& options);
std::map<std::string, std::string> load_model_checkpoint(const std::string& dir, const ModelTensors& model,
                                                         const ParallelReport& report, World& world,
                                                         const CheckpointOptions& options);

// The whole tensor from every rank's `local` piece of `item` (its value or
// its gradient), gathered over the axes of its splits. Collective over them.
at::Tensor gather_whole(const Item& item, const at::Tensor& local, const ParallelReport& report, World& world);
// This rank's piece of `full`, cut by `splits` (contiguous).
at::Tensor take_splits(const at::Tensor& full, const std::vector<ShardSplit>& splits);
// Whether `rank` writes the piece `splits` describe: only its first holder does.
// `apart_axis` (a pipe axis, or empty) is left out: its ranks hold different tensors.
bool writes_piece(const Mesh& mesh, int rank, const std::vector<ShardSplit>& splits,
                  const std::string& apart_axis = "");
// The file holding a rank's pieces: rank-00003.bin.
std::string rank_file(int rank);
// The whole tensor from its pieces in `dir`, checksums verified.
at::Tensor assemble(const ckpt::TensorEntry& e, const std::filesystem::path& dir);
// The checkpoint's metadata, or an error telling a missing checkpoint from an
// incomplete one.
ckpt::Meta read_meta(const std::filesystem::path& dir);

// "sgd", "adam", "adamw", "rmsprop", "adagrad"; throws for any other optimizer.
const char* optimizer_kind(torch::optim::Optimizer& opt);
// The names of a kind's state tensors, as stored: optimizer/<param>/<field>.
std::vector<std::string> state_fields(const std::string& kind);
// The tensors of one parameter's optimizer state by field name (created
// empty when `create`); *step points at the state's step count (Adam, AdamW,
// RMSprop, Adagrad), or is null.
std::vector<std::pair<std::string, at::Tensor*>> state_tensors(torch::optim::Optimizer& opt, const at::Tensor& p,
                                                               bool create, int64_t** step);
// Drops a parameter's state: as it is before its first step.
void clear_state(torch::optim::Optimizer& opt, const at::Tensor& p);

// One model parameter's optimizer state, this rank's shard of it.
struct ParamState {
  at::Tensor param;
  std::string name;  // for errors
  std::vector<std::pair<std::string, at::Tensor>> fields;  // empty: no state (never stepped)
  std::optional<int64_t> step;
};

// Optimizer state (checkpoint_optimizer.cpp). The optimizer of `options`,
// plain or ZeRO-1's inner one; null without.
torch::optim::Optimizer* optimizer_of(const CheckpointOptions& options);
// Throws unless every tensor `opt` updates is a parameter item.
void check_optimizer_params(torch::optim::Optimizer& opt, const std::vector<Item>& items);
// Saving: the optimizer's state as more items, and its kind and steps as
// attributes.
void add_optimizer_items(std::vector<Item>& items, const CheckpointOptions& options,
                         std::map<std::string, std::string>* attributes);
// Loading: every parameter item's state from the checkpoint in `target`, cut
// like the parameter. Changes nothing, so a rank that fails here leaves the
// optimizer as it was; install_optimizer_states (a plain optimizer) or
// ZeroInstall then puts it in.
std::vector<ParamState> read_optimizer_states(torch::optim::Optimizer& optimizer, const CheckpointOptions& options,
                                              const ckpt::Meta& meta, const std::filesystem::path& target,
                                              const std::vector<Item>& items);
void install_optimizer_states(torch::optim::Optimizer& optimizer, const std::vector<ParamState>& loads);
// Master weights (CheckpointOptions::masters, or a ZeroOptimizer's): each
// parameter item's `local` becomes its master (saving: the values to write;
// loading: where the loaded values go, `model` then gets them rounded) and,
// for a plain optimizer, `param` the master (its state's key). Loading
// refuses a checkpoint tensor narrower than its master. Saving with ZeRO is
// collective over the batch axis (the masters are gathered).
void use_masters(std::vector<Item>& items, const CheckpointOptions& options, const ckpt::Meta* loading);

// ZeRO-1 (checkpoint_zero.cpp). The state of every parameter `zero` updates,
// whole over the batch axis: each slice's owner contributes it, and the
// batch-axis rank 0 (the only one that writes it) gets the parameters'
// states; the others get none. Collective over the batch axis.
std::vector<ParamState> gather_zero_state(ZeroOptimizer& zero);
// The inverse: cuts `states` (every parameter of this rank's model shard, as
// a non-ZeRO optimizer would hold them) into this rank's slices and installs
// them in zero's optimizer, and refreshes the slices' parameter values from
// the model (after the model was loaded). Each parameter keeps its own step
// (its segments are the optimizer's tensors). Throws before changing anything.
class ZeroInstall {
 public:
  // `values`: the parameters' new values by parameter (masters loaded in
  // their dtype); a parameter not in it is read from the model.
  ZeroInstall(ZeroOptimizer& zero, const std::vector<ParamState>& states,
              std::map<const void*, at::Tensor> values = {});  // checks and cuts
  void apply();                                                             // cannot fail
 private:
  ZeroOptimizer& zero_;
  std::map<const void*, at::Tensor> values_;
  struct Slice {
    std::vector<std::pair<std::string, at::Tensor>> fields;  // empty: no state
    std::optional<int64_t> step;
  };
  std::vector<std::vector<Slice>> slices_;  // per bucket, per segment
  std::vector<ParamState> locals_;          // ZeroOptimizer::locals(), whole
};

}  // namespace shardplan::ckpt_detail
