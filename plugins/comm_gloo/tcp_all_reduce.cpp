// The pairwise all_reduce of tcp_all_reduce.h.
#include "tcp_all_reduce.h"

#include <gloo/allreduce.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "comm.h"
#include "shardplan/comm_plugin.h"

namespace sp_gloo {

namespace {

// Slot prefix of this exchange; gloo's collectives use 0x01..0x08 and
// comm_gloo.cpp 0x21 and 0x22.
constexpr uint8_t kPairwiseAllReduceSlotPrefix = 0x23;

// Larger messages make the reduction wait for more bytes before it can start
// (the last segment's reduction is never overlapped); smaller ones cost a
// message and a wake-up each, which on a loaded machine is a scheduler tick
// (~4 ms here) per dependent step. gloo's own cap on a ring segment; 256 KiB
// measured no better (bench_comm_gloo --tcp-all-reduce, docs/BENCHMARKS.md).
constexpr size_t kSegmentBytes = 1024 * 1024;

}  // namespace

bool parse_tcp_all_reduce(const std::string& v, TcpAllReduce& out) {
  if (v == "auto") out = TcpAllReduce::kAuto;
  else if (v == "ring") out = TcpAllReduce::kRing;
  else return false;
  return true;
}

// No size measured where the ring won at 2 ranks (4 KiB to 3.76 MB,
// docs/BENCHMARKS.md); `bytes` stays in the rule for when one is found.
bool takes_pairwise_all_reduce(TcpAllReduce mode, int size, size_t /*bytes*/) {
  return mode == TcpAllReduce::kAuto && size == 2;
}

size_t ring_chunk_end(size_t total, size_t es) {
  constexpr size_t P = 2;
  const size_t max_segment = es * std::max<size_t>(1, gloo::detail::AllreduceOptionsImpl::kMaxSegmentSize / es);
  const size_t segments = gloo::roundUp(std::max((total + max_segment - 1) / max_segment, P * 2), P);
  const size_t segment = gloo::roundUp((total + segments - 1) / segments, es);
  return std::min(total, segments / P * segment);
}

size_t pairwise_segment_bytes(size_t total, size_t es) {
  return std::min(total, std::max(es, kSegmentBytes / es * es));
}

namespace {

// dst[0, n) = the ring's result for bytes [at, at + n) of the buffer, from
// rank 0's and rank 1's values there.
void reduce_as_ring(ReduceFn fn, uint8_t* dst, const uint8_t* r0, const uint8_t* r1, size_t at, size_t n,
                    size_t chunk_end, size_t es) {
  const size_t first = at < chunk_end ? std::min(n, chunk_end - at) : 0;
  if (first) fn(dst, r0, r1, first / es);
  if (first < n) fn(dst + first, r1 + first, r0 + first, (n - first) / es);
}

}  // namespace

void pairwise_all_reduce(Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es, ReduceFn fn) {
  const size_t total = r.count * es;
  auto* out = static_cast<uint8_t*>(r.data);
  // Out of place, own segments are sent from s while r fills; otherwise r
  // starts as a copy of s and a segment is overwritten only once it has left.
  const bool apart = !shardplan::comm::overlaps(s.data, total, r.data, total);
  if (!apart && s.data != r.data) std::memmove(out, s.data, total);
  uint8_t* mine = apart ? static_cast<uint8_t*>(s.data) : out;

  const int peer = 1 - c.rank;
  const size_t seg = pairwise_segment_bytes(total, es), chunk_end = ring_chunk_end(total, es);
  const size_t count = (total + seg - 1) / seg;
  if (c.pair_scratch.size() < total) c.pair_scratch.resize(total);
  uint8_t* const theirs = c.pair_scratch.data();
  const auto slot = gloo::Slot::build(kPairwiseAllReduceSlotPrefix, c.next_tag());
  // One buffer per segment, so that each wait is for that segment's message.
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> in(count), sent(count);
  auto length = [&](size_t k) { return std::min(seg, total - k * seg); };
  for (size_t k = 0; k < count; ++k) {
    in[k] = c.ctx->createUnboundBuffer(theirs + k * seg, length(k));
    in[k]->recv(peer, slot, 0, length(k));
  }
  for (size_t k = 0; k < count; ++k) {
    sent[k] = c.ctx->createUnboundBuffer(mine + k * seg, length(k));
    sent[k]->send(peer, slot, 0, length(k));
  }
  for (size_t k = 0; k < count; ++k) {
    const size_t at = k * seg, n = length(k);
    in[k]->waitRecv(c.timeout);
    if (!apart) sent[k]->waitSend(c.timeout);
    const uint8_t* mine_k = mine + at;
    const uint8_t* theirs_k = theirs + at;
    reduce_as_ring(fn, out + at, c.rank == 0 ? mine_k : theirs_k, c.rank == 0 ? theirs_k : mine_k, at, n,
                   chunk_end, es);
  }
  if (apart)
    for (size_t k = 0; k < count; ++k) sent[k]->waitSend(c.timeout);
}

}  // namespace sp_gloo
