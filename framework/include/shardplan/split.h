#pragma once
// How one dim of a parameter is cut across a mesh axis: the vocabulary
// shared by layer plugins (which declare it), the ParallelReport (which lists
// it per parameter) and checkpoints (which put pieces back together with it).
// Torch-free.
#include <cstdint>
#include <string>

namespace shardplan {

// Piece `index` of `parts` (the size of mesh axis `axis`, and this rank's
// coordinate on it) along `dim`, with shard_range's chunks (ceil division,
// the last pieces smaller), each of `blocks` stacked blocks of the dim cut
// alike (fused q/k/v: 3, LSTM gates: 4).
//
// `shared` > 1: fewer pieces than ranks, each held by `shared` consecutive
// ranks of the axis: parts = axis size / shared, and the rank at coordinate c
// holds piece c / shared (grouped-query attention's kv heads when the axis
// exceeds them: 2 heads over 4 ranks, each head on 2). The plugin declares
// `shared`; parallelize fills parts and index from it.
struct ShardSplit {
  int64_t dim = 0;
  std::string axis;
  int64_t parts = 1;
  int64_t index = 0;
  int64_t blocks = 1;
  int64_t shared = 1;
};

}  // namespace shardplan
