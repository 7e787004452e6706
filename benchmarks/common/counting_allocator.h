#pragma once
// Every CPU allocation charged to the rank thread that made it (the charge
// travels with the block, so a free on another thread credits the right
// rank): activation memory counted exactly, not sampled. Install with
//   c10::SetAllocator(c10::DeviceType::CPU, &counting_allocator::counting, 255);
// then point tl_charge at a Charge on each rank's thread.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace counting_allocator {

struct Charge {
  std::atomic<int64_t> live{0};
};
inline thread_local Charge* tl_charge = nullptr;

// Which rank each live block is charged to. A map rather than a header in
// the block: raw_allocate() users require the data pointer to be the
// deleter's context.
struct Block {
  Charge* charge;
  size_t bytes;
};
inline std::mutex blocks_mu;
inline std::unordered_map<void*, Block>& blocks() {
  static auto* m = new std::unordered_map<void*, Block>();  // outlives static destructors
  return *m;
}

inline void release(void* p) {
  {
    std::lock_guard<std::mutex> lock(blocks_mu);
    auto it = blocks().find(p);
    if (it != blocks().end()) {
      if (it->second.charge) it->second.charge->live -= static_cast<int64_t>(it->second.bytes);
      blocks().erase(it);
    }
  }
  c10::free_cpu(p);
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) const override {
    void* p = c10::alloc_cpu(n);
    if (tl_charge) {
      tl_charge->live += static_cast<int64_t>(n);
      std::lock_guard<std::mutex> lock(blocks_mu);
      blocks()[p] = Block{tl_charge, n};
    }
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  // Pure virtual in libtorch 2.x, absent in 1.13: no `override`.
  void copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }
};

inline CountingAllocator counting;

}  // namespace counting_allocator
