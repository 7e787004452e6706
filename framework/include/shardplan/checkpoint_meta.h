#pragma once
// The metadata file of a sharded checkpoint (docs/CHECKPOINTS.md): which
// tensors it holds, their global shapes, and where each rank's piece lies in
// which file with which checksum. Torch-free so the checkpoint tools and the
// fuzzer read it without libtorch.
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace shardplan {
namespace ckpt {

constexpr int kFormatVersion = 1;
constexpr const char* kMetaFile = "metadata.yaml";

// How one dim of a piece was cut from the global tensor: shard `index` of
// `parts` with shard_range's ceil chunks, each of `blocks` stacked blocks cut
// alike (shard.h's shard_of), every piece held by `shared` ranks of the axis
// (parts * shared = the axis size; split.h's ShardSplit). `shared` is
// written only when above 1, so older checkpoints read unchanged.
struct DimSplit {
  int64_t dim = 0;
  std::string axis;                // the mesh axis it was split over
  int64_t parts = 1;
  int64_t index = 0;
  int64_t blocks = 1;
  int64_t shared = 1;
  bool operator==(const DimSplit& o) const {
    return dim == o.dim && axis == o.axis && parts == o.parts && index == o.index && blocks == o.blocks &&
           shared == o.shared;
  }
};

struct Piece {
  int rank = 0;                    // the rank that wrote it
  std::string file;                // relative to the checkpoint directory
  uint64_t offset = 0;             // bytes into `file`
  uint64_t nbytes = 0;
  std::vector<int64_t> shape;      // the piece's own shape
  std::vector<DimSplit> split;     // empty: the whole tensor
  uint32_t crc32c = 0;             // of the nbytes at offset
};

struct TensorEntry {
  std::string name;                // "fc1.weight", "optim.fc1.weight.exp_avg", ...
  std::string dtype;               // "float32", see dtype names in abi/comm.h
  std::vector<int64_t> shape;      // global
  // "[model, null]": the plan's, or the one the plugin cut a parameter no
  // rule places with (a bias following its weight: "[model]"). Informational:
  // loading reads the pieces' splits.
  std::string layout;
  bool buffer = false;             // a module buffer, not a parameter (written only when true)
  std::vector<Piece> pieces;       // together they cover the tensor exactly once
};

struct Meta {
  int format_version = kFormatVersion;
  std::string plan;                // canonical plan YAML ("" when saved unsharded)
  std::vector<std::pair<std::string, int>> mesh;  // axis -> size
  int world_size = 1;
  std::map<std::string, std::string> attributes;  // e.g. optimizer: adam, step: 20
  // Every submodule's path ("blocks.0.attn"), named_modules() order, also
  // those without tensors: a plain torch::save archive has one per module.
  std::vector<std::string> modules;
  std::vector<TensorEntry> tensors;

  const TensorEntry* find(const std::string& name) const;
};

std::string to_yaml(const Meta& meta);
// Throws shardplan::Error "SOURCE:line:col: ..." for anything malformed or
// inconsistent (pieces that overlap or leave gaps, shapes that disagree with
// their splits, sizes that overflow), so a loader can trust what it returns.
// complete = false accepts tensors whose pieces cover only part of them (one
// rank's share, while saving).
Meta parse_meta(const std::string& text, const std::string& source, bool complete = true);

// Element size of a dtype name; 0 if unknown.
size_t dtype_bytes(const std::string& dtype);

// CRC-32C (Castagnoli), as used by iSCSI/ext4; chainable through `crc`.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// Writes `path` so that it either has the new bytes or is untouched: a
// temporary file in the same directory, fsync, rename, fsync of the directory.
void write_file_atomic(const std::string& path, const void* data, size_t n);

// Puts directory `from` where `to` is in one step (renameat2 RENAME_EXCHANGE
// when `to` exists, then removes what was `to`), so a reader sees either the
// old or the new directory, never a mix or nothing.
void replace_directory(const std::string& from, const std::string& to);

}  // namespace ckpt
}  // namespace shardplan
