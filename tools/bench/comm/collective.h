#pragma once
// The collectives the suite measures and their nccl-tests conventions: what
// "size" and "count" mean for each, where the in-place layout puts a rank's
// block, and the bus-bandwidth factor.
#include <cstdint>
#include <string>
#include <vector>

namespace shardplan_bench {

enum class Collective { AllReduce, AllGather, ReduceScatter, Broadcast, AllToAll, SendRecv };

const std::vector<Collective>& all_collectives();
const char* collective_name(Collective c);
// False for an unknown name.
bool parse_collective(const std::string& name, Collective* out);

// busbw = algbw * factor: the bytes each rank's link must carry relative to
// `size`, as nccl-tests defines it, so that busbw is comparable across
// collectives and rank counts (all_reduce 2(n-1)/n, all_gather,
// reduce_scatter and all_to_all (n-1)/n, broadcast and send_recv 1).
double busbw_factor(Collective c, int ranks);

// Whether the collective reduces (and so prints redop "sum") and has a root.
bool reduces(Collective c);
bool has_root(Collective c);

// One measured call, in elements of the chosen dtype.
//  - total: "size" in nccl-tests terms, the larger of one rank's send and
//    receive buffers (all_gather: the gathered buffer, reduce_scatter: the
//    buffer being scattered); size in bytes = total * element size.
//  - count: what an NCCL call of this collective takes as count (per-rank
//    block for all_gather, reduce_scatter and all_to_all; the whole buffer
//    otherwise), the "count" column of nccl-tests.
//  - send / recv: element counts of the send and receive buffers.
//  - block: a rank's share (total / ranks) where the collective has blocks.
struct Geometry {
  uint64_t total = 0, count = 0, send = 0, recv = 0, block = 0;
  bool empty() const { return total == 0; }
};

// The geometry for a requested size in bytes: the element count is rounded
// down to a multiple of the rank count where the collective splits the
// buffer into blocks (as nccl-tests does); empty when nothing is left.
Geometry geometry(Collective c, uint64_t bytes, size_t element_size, int ranks);

}  // namespace shardplan_bench
