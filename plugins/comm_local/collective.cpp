// Steps 1-5 of the protocol for every collective, split's data phase too: one
// function with one switch per step, so each collective's overlap handling,
// checks and data phase read side by side.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "collective.h"
#include "group.h"
#include "kernels.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_dtype.h"
#include "shardplan/comm_plugin.h"
#include "validation.h"

namespace sp_local {
namespace {

using shardplan::comm::dtype_size;
using shardplan::comm::overlaps;

// Whether a collective moving `bytes` (all ranks' buffers together) should
// write with non-temporal stores: only when the data cannot stay in the last
// level cache anyway, so a consumer reading the result right away after a
// small collective still finds it cached. Capped at 32 MiB because VMs and
// chiplet CPUs report the whole package's L3 (384 MiB on the 2-core Debian VM
// this was tuned on), far more than the slice these threads share.
bool use_streaming(size_t bytes) {
  static const size_t threshold = [] {
    const size_t cap = size_t{32} << 20;
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return l3 > 0 ? std::min(static_cast<size_t>(l3), cap) : cap;
  }();
  return bytes > threshold;
}

void copy(void* dst, const void* src, size_t bytes, bool stream) {
  if (stream)
    stream_copy(dst, src, bytes);
  else
    std::memcpy(dst, src, bytes);
}

// What to do after the exit barrier (copies into this rank's own buffers that
// had to wait until no peer reads the source any more).
struct After {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

void split_phase(Comm* c, int& out_rank, std::shared_ptr<Group>& out_group);

}  // namespace

int run_collective(Comm* c, const Desc& d, std::string& msg, sp_comm** split_out) {
  Group& g = *c->g;
  const int n = c->n, r = c->rank;
  const char* what = kind_name(d.kind);
  Slot& me = g.slots[r];

  Local L = validate(d, n, r);
  const size_t es = L.err == SP_OK ? std::max<size_t>(1, dtype_size(L.dtype)) : 1;
  const void* send = d.has_send ? d.send.data : nullptr;
  void* recv = d.has_recv ? d.recv.data : nullptr;
  After after;
  void* rs_dst = recv;  // reduce_scatter: where this rank's result is computed

  if (L.err == SP_OK) {
    const size_t sbytes = d.has_send ? d.send.count * es : 0;
    const size_t rbytes = d.has_recv ? d.recv.count * es : 0;
    const bool ov = d.has_send && d.has_recv && overlaps(send, sbytes, recv, rbytes);
    const size_t blk = L.count * es;  // per-rank block, for the rank-major layouts
    switch (d.kind) {
      case K_ALL_REDUCE:
        // Equal pointers are fine (read-all-then-write-all per element); a
        // partial overlap would let a peer's writes reach our unread input.
        if (ov && send != recv) {
          void* s = c->scratch_for(sbytes, c->scratch);
          std::memcpy(s, send, sbytes);
          send = s;
        }
        break;
      case K_ALL_GATHER:
      case K_ALL_TO_ALL: {
        // Peers read our send while we write our recv blocks. Only our own
        // block of an all_gather may coincide with our send.
        const bool own_block = d.kind == K_ALL_GATHER && send == static_cast<char*>(recv) + r * blk;
        const bool self_only = d.kind == K_ALL_TO_ALL && n == 1 && send == recv;
        if (ov && !own_block && !self_only) {
          void* s = c->scratch_for(sbytes, c->scratch);
          std::memcpy(s, send, sbytes);
          send = s;
        }
        break;
      }
      case K_REDUCE_SCATTER:
        // Peers read blocks j != r of our send; only block r may be our recv.
        if (ov && recv != static_cast<const char*>(send) + r * blk) {
          rs_dst = c->scratch_for(rbytes, c->scratch);
          after = {recv, rs_dst, rbytes};
        }
        break;
      case K_BROADCAST:
        if (r == d.root && d.has_recv && recv != send && ov) after = {recv, send, rbytes};  // as for scatter
        break;
      case K_SCATTER:
        // Peers read our send during the data phase: an overlapping recv is
        // filled after the exit barrier.
        if (r == d.root && ov && recv != static_cast<const char*>(send) + r * blk)
          after = {recv, static_cast<const char*>(send) + r * blk, rbytes};
        break;
      case K_GATHER:
        // Our own block goes in before anyone writes the others, so it does
        // not matter whether our send overlaps them.
        if (r == d.root && blk && send != static_cast<char*>(recv) + r * blk)
          std::memmove(static_cast<char*>(recv) + r * blk, send, blk);
        break;
      default:
        break;
    }
  }

  me.kind = d.kind;
  me.dtype = L.dtype;
  me.count = L.count;
  me.op = d.op;
  me.root = d.root;
  me.send = send;
  me.recv = recv;
  me.err = L.err;
  if (L.err != SP_OK) me.why = L.why;
  me.color = d.color;
  me.key = d.key;
  ++c->seq;
  me.entered.store(c->seq, std::memory_order_relaxed);

  int st = enter(c, what, msg);
  if (st != SP_OK) return st;

  // Everyone sees the same slots, so everyone takes the same branch here.
  int bad = -1;
  for (int j = 0; j < n && bad < 0; ++j) {
    const Slot& s = g.slots[j];
    if (s.err != SP_OK) {
      bad = j;
      st = s.err;
      msg = j == r ? L.why
                   : std::string("local ") + what + ": rank " + std::to_string(j) +
                         " of group '" + g.name + "' passed bad arguments: " + s.why;
    }
  }
  if (bad < 0) {
    const Slot& s0 = g.slots[0];
    for (int j = 1; j < n && bad < 0; ++j) {
      const Slot& s = g.slots[j];
      const bool same = s.kind == s0.kind && s.dtype == s0.dtype && s.count == s0.count &&
                        (!has_op(s.kind) || s.op == s0.op) && (!has_root(s.kind) || s.root == s0.root);
      if (!same) {
        bad = j;
        st = SP_ERR_INVALID;
        msg = std::string("local ") + what + ": ranks of group '" + g.name + "' disagree: rank 0 called " +
              describe_slot(s0) + ", rank " + std::to_string(j) + " called " + describe_slot(s);
      }
    }
  }

  int new_rank = -1;
  std::shared_ptr<Group> child;
  if (bad < 0) {
    const size_t cnt = L.count;
    const size_t blk = cnt * es;
    // Every rank's input and output, as seen by the cache.
    const size_t rank_bytes = d.kind == K_ALL_REDUCE || d.kind == K_ALL_TO_ALL ? 2 * blk
                              : d.kind == K_BROADCAST || d.kind == K_SCATTER || d.kind == K_GATHER ? blk
                                                                                                   : (n + 1) * blk;
    const bool stream = use_streaming(rank_bytes * n);
    switch (d.kind) {
      case K_ALL_REDUCE: {
        // 64-byte aligned chunks: no two ranks write the same cache line.
        const size_t line = std::max<size_t>(1, 64 / es);
        const size_t chunk = ((cnt + n - 1) / n + line - 1) / line * line;
        const size_t lo = std::min(cnt, chunk * r), hi = std::min(cnt, lo + chunk);
        if (hi > lo) {
          for (int k = 0; k < n; ++k) {
            c->srcs[k] = static_cast<const char*>(g.slots[k].send) + lo * es;
            c->dsts[k] = static_cast<char*>(g.slots[k].recv) + lo * es;
          }
          reduce_fn(L.dtype, d.op)(c->dsts.data(), n, c->srcs.data(), n, hi - lo, stream);
        }
        break;
      }
      case K_REDUCE_SCATTER:
        if (cnt) {
          for (int k = 0; k < n; ++k) c->srcs[k] = static_cast<const char*>(g.slots[k].send) + r * blk;
          c->dsts[0] = rs_dst;
          reduce_fn(L.dtype, d.op)(c->dsts.data(), 1, c->srcs.data(), n, cnt,
                                   stream && !after.bytes && rs_dst != c->srcs[r]);
        }
        break;
      case K_ALL_GATHER:
        for (int j = 0; j < n && blk; ++j) {
          char* dst = static_cast<char*>(recv) + j * blk;
          if (dst != g.slots[j].send) copy(dst, g.slots[j].send, blk, stream);
        }
        break;
      case K_ALL_TO_ALL: {
        const size_t b = blk / n;
        for (int j = 0; j < n && b; ++j) {
          char* dst = static_cast<char*>(recv) + j * b;
          const char* src = static_cast<const char*>(g.slots[j].send) + r * b;
          if (dst != src) copy(dst, src, b, stream);
        }
        break;
      }
      case K_BROADCAST:
        if (blk && recv && !after.bytes && recv != g.slots[d.root].send)
          copy(recv, g.slots[d.root].send, blk, stream);
        break;
      case K_SCATTER: {
        const char* src = static_cast<const char*>(g.slots[d.root].send) + r * blk;
        if (blk && !after.bytes && recv != src) copy(recv, src, blk, stream);
        break;
      }
      case K_GATHER:
        if (blk && r != d.root) copy(static_cast<char*>(g.slots[d.root].recv) + r * blk, send, blk, stream);
        break;
      case K_SPLIT:
        split_phase(c, new_rank, child);
        break;
      default:
        break;
    }
    if (stream) stream_fence();
  }

  leave(c);

  if (bad >= 0) return st;
  if (after.bytes) std::memmove(after.dst, after.src, after.bytes);
  if (d.kind == K_SPLIT) {
    if (me.child) me.child.reset();  // we were the leader: the members have their copies now
    *split_out = child ? reinterpret_cast<sp_comm*>(new Comm(child, new_rank, c->timeout_ms)) : nullptr;
  }
  return SP_OK;
}

namespace {

// Inside the data phase of split: the first member of each color (in new-rank
// order) creates the child group, a second barrier publishes it, and the
// others pick it up.
void split_phase(Comm* c, int& out_rank, std::shared_ptr<Group>& out_group) {
  Group& g = *c->g;
  const int r = c->rank;
  const int color = g.slots[r].color;
  std::vector<std::pair<int, int>> members;  // (key, parent rank)
  if (color >= 0)
    for (int j = 0; j < c->n; ++j)
      if (g.slots[j].color == color) members.emplace_back(g.slots[j].key, j);
  std::sort(members.begin(), members.end());
  int leader = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == r) out_rank = static_cast<int>(i);
  }
  if (!members.empty()) leader = members[0].second;
  const uint32_t index = c->splits++;
  if (leader == r) {
    auto child = std::make_shared<Group>(g.name + "/split" + std::to_string(index) + "." + std::to_string(color),
                                         static_cast<int>(members.size()));
    {
      std::lock_guard<std::mutex> lock(g.mu);
      g.children.erase(std::remove_if(g.children.begin(), g.children.end(),
                                      [](const std::weak_ptr<Group>& w) { return w.expired(); }),
                       g.children.end());
      g.children.push_back(child);
      if (g.aborted.load()) {
        child->abort_reason = "inherited from group '" + g.name + "': " + g.abort_reason;
        child->aborted.store(true);
      }
    }
    g.slots[r].child = child;
  }
  leave(c);
  if (leader >= 0) out_group = g.slots[leader].child;
}

}  // namespace

}  // namespace sp_local
