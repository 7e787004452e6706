#pragma once
// What checkpoint.cpp (saving, loading with a world) and
// checkpoint_offline.cpp (reading pieces back, resharding) share. Not
// installed.
#include <ATen/core/Tensor.h>

#include <filesystem>
#include <string>
#include <vector>

#include "shardplan/checkpoint_meta.h"
#include "shardplan/mesh.h"
#include "shardplan/split.h"

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

}  // namespace shardplan::ckpt_detail
