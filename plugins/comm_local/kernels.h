// Element kernels of the local backend: reductions over any number of source
// buffers into any number of destinations, for every sp_dtype x sp_reduce_op.
//
// Everything works on tiles that fit in L1: a tile of every source is read and
// reduced into a local accumulator before any destination is written. That is
// what makes in-place (a destination equal to a source) safe for the rank that
// owns the tile, and it lets the compiler vectorize the inner loops without
// runtime alias checks (the accumulator is a local array nobody else can see).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "shardplan/abi/comm.h"
#include "shardplan/comm_dtype.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace sp_local {

// Integer sum/product wrap around (two's complement, comm_dtype.h) instead of being UB.
struct OpSum {
  template <class A> static A ap(A a, A b) {
    if constexpr (std::is_integral_v<A>)
      return shardplan::comm::wrapping_add(a, b);
    else
      return a + b;
  }
};
struct OpProd {
  template <class A> static A ap(A a, A b) {
    if constexpr (std::is_integral_v<A>)
      return shardplan::comm::wrapping_mul(a, b);
    else
      return a * b;
  }
};
struct OpMax {
  template <class A> static A ap(A a, A b) { return a < b ? b : a; }
};
struct OpMin {
  template <class A> static A ap(A a, A b) { return b < a ? b : a; }
};

constexpr size_t kTile = 2048;

// Copy with non-temporal stores: for a large destination that nobody has read
// (out of place), a normal store first reads every line from memory (write
// allocate), a third of the traffic for nothing. The caller must fence
// (stream_fence) before another thread may read the data.
inline void stream_copy(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (head > bytes) head = bytes;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  for (; bytes >= 64; bytes -= 64, d += 64, s += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  for (; bytes >= 16; bytes -= 16, d += 16, s += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  std::memcpy(d, s, bytes);
#else
  std::memcpy(dst, src, bytes);
#endif
}

// Non-temporal stores are not ordered by the barrier's release/acquire.
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// dst[j][i] = op over k of src[k][i], i in [0, len), for every j. With
// `stream`, destinations that are not also sources (dsts[j] != srcs[j]) are
// written with non-temporal stores; the caller fences.
using ReduceFn = void (*)(void* const* dsts, int ndst, const void* const* srcs, int nsrc, size_t len, bool stream);

template <int DT, class Op>
void reduce_kernel(void* const* dsts, int ndst, const void* const* srcs, int nsrc, size_t len, bool stream) {
  using E = shardplan::comm::dtype_traits<DT>;
  using S = typename E::storage;
  using A = typename E::compute;
  constexpr bool kConvert = !std::is_same_v<S, A>;
  alignas(64) A acc[kTile];
  alignas(64) S out[kConvert ? kTile : 1];
  for (size_t t = 0; t < len; t += kTile) {
    const size_t m = std::min(kTile, len - t);
    const S* s0 = static_cast<const S*>(srcs[0]) + t;
    if (nsrc >= 2) {
      const S* s1 = static_cast<const S*>(srcs[1]) + t;
      for (size_t i = 0; i < m; ++i) acc[i] = Op::ap(E::load(s0[i]), E::load(s1[i]));
    } else {
      for (size_t i = 0; i < m; ++i) acc[i] = E::load(s0[i]);
    }
    for (int k = 2; k < nsrc; ++k) {
      const S* sk = static_cast<const S*>(srcs[k]) + t;
      for (size_t i = 0; i < m; ++i) acc[i] = Op::ap(acc[i], E::load(sk[i]));
    }
    const S* res;
    if constexpr (kConvert) {
      for (size_t i = 0; i < m; ++i) out[i] = E::store(acc[i]);
      res = out;
    } else {
      res = acc;
    }
    for (int j = 0; j < ndst; ++j) {
      S* dst = static_cast<S*>(dsts[j]) + t;
      if (stream && (j >= nsrc || dsts[j] != srcs[j]))
        stream_copy(dst, res, m * sizeof(S));
      else
        std::memcpy(dst, res, m * sizeof(S));
    }
  }
}

template <int DT>
ReduceFn reduce_for_op(int op) {
  switch (op) {
    case SP_SUM: return &reduce_kernel<DT, OpSum>;
    case SP_MAX: return &reduce_kernel<DT, OpMax>;
    case SP_MIN: return &reduce_kernel<DT, OpMin>;
    case SP_PROD: return &reduce_kernel<DT, OpProd>;
    default: return nullptr;
  }
}

inline ReduceFn reduce_fn(int dtype, int op) {
  return shardplan::comm::visit_dtype(
      dtype, [op](auto dt) { return reduce_for_op<decltype(dt)::value>(op); }, ReduceFn{nullptr});
}

}  // namespace sp_local
