#pragma once
// What checkpoint.cpp (saving, loading with a world) and
// checkpoint_offline.cpp (reading pieces back, resharding) share. Not
// installed.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/checkpoint_meta.h"
#include "shardplan/mesh.h"
#include "shardplan/split.h"

namespace torch::optim {
class Optimizer;
}

namespace shardplan {
class ZeroOptimizer;
}

namespace shardplan::ckpt_detail {

// This rank's piece of `full`, cut by `splits` (contiguous).
at::Tensor take_splits(const at::Tensor& full, const std::vector<ShardSplit>& splits);
// Whether `rank` writes the piece `splits` describe: only its first holder does.
bool writes_piece(const Mesh& mesh, int rank, const std::vector<ShardSplit>& splits);
// The file holding a rank's pieces: rank-00003.bin.
std::string rank_file(int rank);
// The whole tensor from its pieces in `dir`, checksums verified.
at::Tensor assemble(const ckpt::TensorEntry& e, const std::filesystem::path& dir);
// The checkpoint's metadata, or an error telling a missing checkpoint from an
// incomplete one.
ckpt::Meta read_meta(const std::filesystem::path& dir);

// "sgd", "adam", "adamw"; throws for any other optimizer.
const char* optimizer_kind(torch::optim::Optimizer& opt);
// The tensors of one parameter's optimizer state by field name (created
// empty when `create`); *step points at Adam's step count, or is null.
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

// ZeRO-1 (checkpoint_zero.cpp). The state of every parameter `zero` updates,
// whole over the batch axis: each slice's owner contributes it, and the
// batch-axis rank 0 (the only one that writes it) gets the parameters'
// states; the others get none. Collective over the batch axis.
std::vector<ParamState> gather_zero_state(ZeroOptimizer& zero);
// The inverse: cuts `states` (every parameter of this rank's model shard, as
// a non-ZeRO optimizer would hold them) into this rank's slices and installs
// them in zero's optimizer, and refreshes the slices' parameter values from
// the model (after the model was loaded). Parameters of one bucket step
// together, so their Adam steps must agree. Throws before changing anything.
class ZeroInstall {
 public:
  ZeroInstall(ZeroOptimizer& zero, const std::vector<ParamState>& states);  // checks and cuts
  void apply();                                                             // cannot fail
 private:
  ZeroOptimizer& zero_;
  struct Slice {
    std::vector<std::pair<std::string, at::Tensor>> fields;  // empty: no state
    std::optional<int64_t> step;
  };
  std::vector<Slice> slices_;
};

}  // namespace shardplan::ckpt_detail
