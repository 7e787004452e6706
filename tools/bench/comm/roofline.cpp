#include "roofline.h"

#include <algorithm>

#include "shardplan/comm_dtype.h"

namespace shardplan_bench {

namespace {

using shardplan::comm::dtype_traits;

template <class S>
__attribute__((noinline)) void add2(S* __restrict__ d, const S* __restrict__ a, const S* __restrict__ b, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = a[i] + b[i];
}
template <class S>
__attribute__((noinline)) void acc2(S* __restrict__ d, const S* __restrict__ a, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] += a[i];
}

// Sums in L1-sized chunks so each input is streamed once whatever the count.
template <int32_t DT>
void sum_chunked(void* dst, const void* const* src, int nsrc, size_t lo, size_t hi) {
  using T = dtype_traits<DT>;
  using S = typename T::storage;
  using C = typename T::compute;
  constexpr size_t kChunk = 512;
  C acc[kChunk];
  for (size_t base = lo; base < hi; base += kChunk) {
    const size_t m = std::min(kChunk, hi - base);
    const S* s0 = static_cast<const S*>(src[0]) + base;
    for (size_t i = 0; i < m; ++i) acc[i] = T::load(s0[i]);
    for (int k = 1; k < nsrc; ++k) {
      const S* sk = static_cast<const S*>(src[k]) + base;
      for (size_t i = 0; i < m; ++i) acc[i] += T::load(sk[i]);
    }
    S* d = static_cast<S*>(dst) + base;
    for (size_t i = 0; i < m; ++i) d[i] = T::store(acc[i]);
  }
}

template <int32_t DT>
void sum_slice_t(void* dst, const void* const* src, int nsrc, size_t lo, size_t hi) {
  using T = dtype_traits<DT>;
  using S = typename T::storage;
  // Native types with two inputs: the plain loops, which is what "two
  // threads summing" means for the common 2-rank case.
  if constexpr (std::is_same<S, typename T::compute>::value) {
    if (nsrc == 2) {
      S* d = static_cast<S*>(dst) + lo;
      const S* a = static_cast<const S*>(src[0]) + lo;
      const S* b = static_cast<const S*>(src[1]) + lo;
      if (d == a) acc2(d, b, hi - lo);
      else add2(d, a, b, hi - lo);
      return;
    }
  }
  sum_chunked<DT>(dst, src, nsrc, lo, hi);
}

class RooflineRank final : public Rank {
 public:
  RooflineRank(Roofline& s, int rank, int size, int32_t dt) : s_(s), rank_(rank), size_(size), dt_(dt) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool supports(Collective c) const override { return c == Collective::AllReduce; }
  bool checkable() const override { return false; }

  int run(const Call& c) override {
    s_.send[rank_] = c.send;
    s_.recv[rank_] = c.recv;
    s_.barrier.wait();
    // 64-byte aligned slices, so no two threads write one cache line.
    const size_t es = shardplan::comm::dtype_size(dt_), per_line = 64 / es;
    const size_t n = c.recv_count;
    const size_t slice = (n / size_ + per_line - 1) / per_line * per_line;
    const size_t lo = std::min(n, slice * rank_), hi = rank_ == size_ - 1 ? n : std::min(n, lo + slice);
    if (hi > lo) {
      const std::vector<void*>& in = c.in_place ? s_.recv : s_.send;
      sum_slice(dt_, s_.recv[0], in.data(), size_, lo, hi);
    }
    s_.barrier.wait();
    return 0;
  }

 private:
  Roofline& s_;
  const int rank_, size_;
  const int32_t dt_;
};

}  // namespace

void accumulate_f32(float* __restrict__ a, const float* __restrict__ b, size_t n) { acc2(a, b, n); }

void sum_slice(int32_t dt, void* dst, const void* const* src, int nsrc, size_t lo, size_t hi) {
  shardplan::comm::visit_dtype(
      dt,
      [&](auto d) {
        sum_slice_t<decltype(d)::value>(dst, src, nsrc, lo, hi);
        return 0;
      },
      0);
}

std::unique_ptr<Rank> make_roofline_rank(Roofline& shared, int rank, int size, int32_t dtype) {
  return std::make_unique<RooflineRank>(shared, rank, size, dtype);
}

}  // namespace shardplan_bench
