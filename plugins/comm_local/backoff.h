#pragma once
// How a rank waits for its peers at a barrier. Header-only: the spin loop is
// the small-message latency budget and must inline into the barriers.
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cstdint>

namespace sp_local {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Waiting for a peer: spin briefly (a peer on another core arrives within a
// microsecond or two), then yield (ranks may outnumber cores, and the rank we
// wait for may need our core), then sleep in short slices so a long wait (a
// peer busy computing) does not burn a core.
//
// How long to spin adapts per communicator: it doubles while peers keep
// arriving during the spin and halves each time we end up yielding. With 2
// ranks on 2 idle cores every wait ends in the spin (~0.5 us per small
// all_reduce); when ranks share a core (more ranks than cores, or a busy
// machine) spinning only delays the peer that needs our core, and a fixed
// spin of 2000 made 4 ranks on 2 cores ~10x slower.
class Backoff {
 public:
  static constexpr uint32_t kMinSpins = 4;
  static constexpr uint32_t kMaxSpins = 512;  // ~14 us of PAUSE on current x86
  static constexpr uint32_t kInitialSpins = 64;

  explicit Backoff(uint32_t& budget) : budget_(budget), spins_(budget) {}
  ~Backoff() {
    if (n_ == 0) return;  // did not wait at all: no evidence either way
    budget_ = n_ < spins_ ? std::min(kMaxSpins, budget_ * 2) : std::max(kMinSpins, budget_ / 2);
  }
  Backoff(const Backoff&) = delete;
  Backoff& operator=(const Backoff&) = delete;

  void pause() {
    ++n_;
    if (n_ < spins_) {
      cpu_relax();
    } else if (n_ < spins_ + kYields) {
      sched_yield();
    } else {
      struct timespec ts = {0, 50 * 1000};
      nanosleep(&ts, nullptr);
    }
  }
  // The clock is read every iteration once we yield (a yield costs more than
  // the vDSO clock read) and every 64 spins before that.
  bool clock_due() const { return n_ >= spins_ || (n_ & 63u) == 0; }

 private:
  static constexpr uint32_t kYields = 4000;
  uint32_t& budget_;
  const uint32_t spins_;
  uint32_t n_ = 0;
};

}  // namespace sp_local
