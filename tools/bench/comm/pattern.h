#pragma once
// What --check puts in the buffers and expects back. Values are small
// integers, so every dtype holds them and any summation order gives the same
// bits: reduction inputs are 1..3 (a sum over 40 ranks is at most 120, exact
// in int8 and bfloat16), copied values 1..97 and different on each rank, so
// a block landing in the wrong place is counted as wrong.
#include <cstdint>
#include <cstring>

#include "shardplan/comm_dtype.h"

namespace shardplan_bench {

inline int64_t reduce_input(int rank, uint64_t i) { return static_cast<int64_t>((rank + i % 3) % 3 + 1); }
inline int64_t copy_value(int rank, uint64_t i) { return static_cast<int64_t>((rank * 5 + (i % 97) * 3) % 97 + 1); }

// The sum over `ranks` ranks of reduce_input at index i, which only depends
// on i % 3.
struct ReduceSum {
  explicit ReduceSum(int ranks) {
    for (int j = 0; j < 3; ++j) {
      by_mod[j] = 0;
      for (int r = 0; r < ranks; ++r) by_mod[j] += reduce_input(r, j);
    }
  }
  int64_t operator()(uint64_t i) const { return by_mod[i % 3]; }
  int64_t by_mod[3];
};

// p[i] = value(i) for i in [0, n), in dtype dt.
template <class F>
void fill(int32_t dt, void* p, uint64_t n, F value) {
  shardplan::comm::visit_dtype(
      dt,
      [&](auto d) {
        using T = shardplan::comm::dtype_traits<decltype(d)::value>;
        auto* out = static_cast<typename T::storage*>(p);
        for (uint64_t i = 0; i < n; ++i) out[i] = T::store(static_cast<typename T::compute>(value(i)));
        return 0;
      },
      0);
}

// How many of p[0, n) differ, bit for bit, from value(i) stored in dtype dt.
template <class F>
uint64_t count_wrong(int32_t dt, const void* p, uint64_t n, F value) {
  return shardplan::comm::visit_dtype(
      dt,
      [&](auto d) {
        using T = shardplan::comm::dtype_traits<decltype(d)::value>;
        using S = typename T::storage;
        const auto* in = static_cast<const S*>(p);
        uint64_t wrong = 0;
        for (uint64_t i = 0; i < n; ++i) {
          const S want = T::store(static_cast<typename T::compute>(value(i)));
          wrong += std::memcmp(&in[i], &want, sizeof(S)) != 0;
        }
        return wrong;
      },
      n);
}

}  // namespace shardplan_bench
