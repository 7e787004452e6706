#pragma once
// The shared-memory roofline: the least work any all-reduce of N ranks on
// one machine needs. N threads, each summing its slice of all N buffers into
// rank 0's buffer between two spin barriers: every input byte read once, the
// output written once, no copies to the other ranks, no synchronisation but
// the two barriers. Also used by benchmarks/comm_local.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "rank.h"

namespace shardplan_bench {

// Sense-free generation barrier; waiters spin, then yield, so ranks sharing
// a core still make progress.
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void wait() {
    const uint64_t gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      gen_.store(gen + 1, std::memory_order_release);
      return;
    }
    int spins = 0;
    while (gen_.load(std::memory_order_acquire) == gen)
      if (++spins > 2000) std::this_thread::yield();
  }

 private:
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<uint64_t> gen_{0};
};

// a[i] += b[i]: the whole work of a 2-rank in-place sum.
void accumulate_f32(float* __restrict__ a, const float* __restrict__ b, size_t n);

// dst[i] = src[0][i] + ... + src[nsrc-1][i] for i in [lo, hi), in dtype dt
// (half types summed in float); dst may be src[0].
void sum_slice(int32_t dt, void* dst, const void* const* src, int nsrc, size_t lo, size_t hi);

// What the roofline's ranks share: the barrier and each rank's buffers.
struct Roofline {
  explicit Roofline(int n) : barrier(n), send(n), recv(n) {}
  SpinBarrier barrier;
  std::vector<void*> send, recv;
};

// Rank `rank` of the roofline; all_reduce only, nothing to --check.
std::unique_ptr<Rank> make_roofline_rank(Roofline& shared, int rank, int size, int32_t dtype);

}  // namespace shardplan_bench
