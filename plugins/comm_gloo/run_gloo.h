#pragma once
// Running gloo's collectives on a communicator's buffers.
#include <gloo/common/error.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "comm.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_plugin.h"

namespace sp_gloo {

using shardplan::comm::overlaps;

inline uint8_t* bytes(const sp_buffer& b, size_t offset = 0) { return static_cast<uint8_t*>(b.data) + offset; }

// gloo's option setters take the element type only for its size.
template <typename F>
void by_element_size(size_t es, F&& f) {
  switch (es) {
    case 1: f(uint8_t{}); break;
    case 2: f(uint16_t{}); break;
    case 4: f(uint32_t{}); break;
    case 8: f(uint64_t{}); break;
    default: GLOO_THROW("unsupported element size ", es);
  }
}

// Runs one of gloo's collectives on `c`: `fill` completes its options, which
// already carry the communicator's timeout and its next tag, drawn by the
// executing thread in issue order so that all ranks agree on it without
// talking.
template <typename Opts, typename Fill>
void run_gloo(Comm& c, void (*collective)(Opts&), Fill&& fill) {
  std::remove_const_t<Opts> o(c.ctx);
  o.setTag(c.next_tag());
  o.setTimeout(c.timeout);
  fill(o);
  collective(o);
}

// The same over buffers of `es`-byte elements: `fill(o, e)` also gets a value
// e of an unsigned type of that size, for gloo's typed setters.
template <typename Opts, typename Fill>
void run_gloo(Comm& c, size_t es, void (*collective)(Opts&), Fill&& fill) {
  by_element_size(es, [&](auto e) { run_gloo(c, collective, [&](auto& o) { fill(o, e); }); });
}

// The same for a collective with a root.
template <typename Opts, typename Fill>
void run_gloo(Comm& c, size_t es, int32_t root, void (*collective)(Opts&), Fill&& fill) {
  run_gloo(c, es, collective, [&](auto& o, auto e) {
    o.setRoot(root);
    fill(o, e);
  });
}

// What gloo should read for an input of n bytes at p: p itself, or a private
// copy when this collective's own writes may land there first.
class StableInput {
 public:
  StableInput(uint8_t* p, size_t n, bool overwritten) : data_(p) {
    if (!overwritten) return;
    copy_.assign(p, p + n);
    data_ = copy_.data();
  }
  StableInput(const StableInput&) = delete;
  StableInput& operator=(const StableInput&) = delete;

  uint8_t* data() const { return data_; }

 private:
  std::vector<uint8_t> copy_;
  uint8_t* data_;
};

// At the root of scatter and gather: whether a rank's own buffer of one block
// overlaps the root's buffer of one block per rank other than as the root's
// own block (that in-place layout is safe).
inline bool overlaps_other_blocks(const void* own, const sp_buffer& blocks, size_t block_bytes, const Comm& c,
                                  int32_t root) {
  return own != bytes(blocks, block_bytes * root) && overlaps(own, block_bytes, blocks.data, block_bytes * c.size);
}

}  // namespace sp_gloo
