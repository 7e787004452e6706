#pragma once
// Multi-rank Google Benchmark runs: rank 0 runs the benchmark's loop and
// posts each step before taking it; the other ranks take a step only once it
// is posted, so none of them ever enters a collective that rank 0 will not
// join. A shared counter rather than a barrier per step: a gloo barrier costs
// hundreds of microseconds and would swamp the steps being measured.
#include <atomic>
#include <cstdint>
#include <thread>

class Lockstep {
 public:
  void post() { posted_.fetch_add(1, std::memory_order_release); }
  void finish() { finished_.store(true, std::memory_order_release); }
  // Follower side: true once step `n` (0-based) is posted, false when rank 0
  // finished without posting it.
  bool wait_for(int64_t n) const {
    for (;;) {
      if (posted_.load(std::memory_order_acquire) > n) return true;
      if (finished_.load(std::memory_order_acquire)) return posted_.load(std::memory_order_acquire) > n;
      std::this_thread::yield();
    }
  }

 private:
  std::atomic<int64_t> posted_{0};
  std::atomic<bool> finished_{false};
};
