#pragma once
// all_reduce between two ranks over gloo's TCP transport as one exchange:
// each rank posts receives for the peer's whole buffer, sends its own and
// reduces each segment as it lands. gloo's ring (gloo::allreduce) cuts even
// two ranks' buffers into >= 4 segments in two dependent phases (reduce-
// scatter, then all-gather), and every one of those messages first waits for
// the receiver's NOTIFY_RECV_READY; here the receives are all posted before
// anything is sent, so the handshakes overlap and a small buffer costs one
// round trip instead of several. Each rank moves the same bytes as in the
// ring and reduces twice the elements (both halves), which at the sizes
// measured cost less than the round trips it saves (docs/BENCHMARKS.md).
//
// Results are bit for bit the ring's: the ring leaves rank 0's chunk as
// op(rank 0's, rank 1's) and rank 1's as op(rank 1's, rank 0's) (its
// reduce-scatter reduces the local value with the received one), which only
// matters where op is not commutative in the bits (max/min of -0 and +0,
// NaN payloads); both ranks compute each element with those operands in that
// order, so they also agree with each other. One exception: a sum or product
// of two NaNs is a NaN whose payload the CPU takes from one operand by its
// place in the instruction, which the compiler picks per loop (vectorized
// body or scalar tail, after run-time alias checks), so it can follow where
// a reduction call starts and ends and which buffers alias: that payload may
// differ from the ring's, and between the ranks (the ring computes each
// element once and copies it).
#include <cstddef>
#include <cstdint>
#include <string>

#include "reduce.h"
#include "shardplan/abi/comm.h"

namespace sp_gloo {

class Comm;

// all_reduce=ring|auto: whether a TCP all_reduce may take the pairwise
// exchange (auto, the default) or always takes gloo's ring (for comparison).
enum class TcpAllReduce { kAuto, kRing };
bool parse_tcp_all_reduce(const std::string& v, TcpAllReduce& out);

// Whether an all_reduce of `bytes` over TCP takes the pairwise exchange:
// decided by the group size and the bytes alone, so all ranks agree.
bool takes_pairwise_all_reduce(TcpAllReduce mode, int size, size_t bytes);

// Where gloo's ring at two ranks ends rank 0's chunk, in bytes (<= total):
// its segment count and size for `total` bytes of `es`-byte elements with
// gloo's default maximum segment (ring() in gloo/allreduce.cc as of the
// packaged 2022-05 gloo; TcpPairAllReduceIsGloosRingBitForBit notices a
// gloo that cuts differently).
size_t ring_chunk_end(size_t total, size_t es);

// Bytes per message of the exchange; a multiple of es.
size_t pairwise_segment_bytes(size_t total, size_t es);

// r = s op (the peer's s), as the ring would give it. s and r may be the
// same buffer or overlap.
void pairwise_all_reduce(Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es, ReduceFn fn);

}  // namespace sp_gloo
