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

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace sp_local {

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// IEEE half <-> float without F16C, so the plugin runs on any x86-64 and
// aarch64. Branch-light versions after F. Giesen's public-domain half.c.
inline float f16_to_float(uint16_t h) {
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t o = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t exp = o & shifted_exp;
  o += (127u - 15u) << 23;
  if (exp == shifted_exp) {
    o += (128u - 16u) << 23;  // Inf/NaN keep an all-ones exponent
  } else if (exp == 0) {
    // Subnormal: let the FPU normalize it.
    o += 1u << 23;
    o = bits_of(float_of(o) - float_of(113u << 23));
  }
  o |= static_cast<uint32_t>(h & 0x8000u) << 16;
  return float_of(o);
}

// Round to nearest, ties to even; overflow becomes Inf, NaN stays a quiet NaN.
inline uint16_t float_to_f16(float value) {
  uint32_t f = bits_of(value);
  const uint32_t sign = f & 0x80000000u;
  f ^= sign;
  uint16_t o;
  if (f >= ((127u + 16u) << 23)) {
    o = f > (255u << 23) ? 0x7e00 : 0x7c00;
  } else if (f < (113u << 23)) {
    // Result is subnormal or zero: adding this magic makes the FPU's own
    // round-to-nearest-even do the rounding at the right bit.
    const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    o = static_cast<uint16_t>(bits_of(float_of(f) + float_of(denorm_magic)) - denorm_magic);
  } else {
    const uint32_t mant_odd = (f >> 13) & 1u;
    f += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;
    f += mant_odd;
    o = static_cast<uint16_t>(f >> 13);
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

inline float bf16_to_float(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float value) {
  const uint32_t u = bits_of(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Storage type S, accumulator type A, and the conversions between them.
template <int DT> struct Elem;
#define SP_LOCAL_NATIVE(DT, T)                     \
  template <> struct Elem<DT> {                    \
    using S = T;                                   \
    using A = T;                                   \
    static A load(S v) { return v; }               \
    static S store(A a) { return a; }              \
  };
SP_LOCAL_NATIVE(SP_FLOAT32, float)
SP_LOCAL_NATIVE(SP_FLOAT64, double)
SP_LOCAL_NATIVE(SP_INT8, int8_t)
SP_LOCAL_NATIVE(SP_UINT8, uint8_t)
SP_LOCAL_NATIVE(SP_INT32, int32_t)
SP_LOCAL_NATIVE(SP_INT64, int64_t)
#undef SP_LOCAL_NATIVE
template <> struct Elem<SP_FLOAT16> {
  using S = uint16_t;
  using A = float;
  static A load(S v) { return f16_to_float(v); }
  static S store(A a) { return float_to_f16(a); }
};
template <> struct Elem<SP_BFLOAT16> {
  using S = uint16_t;
  using A = float;
  static A load(S v) { return bf16_to_float(v); }
  static S store(A a) { return float_to_bf16(a); }
};

// Integer sum/product wrap around (two's complement) instead of being UB.
struct OpSum {
  template <class A> static A ap(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
      using U = std::make_unsigned_t<A>;
      return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
struct OpProd {
  template <class A> static A ap(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
      // uint32_t at least, so that uint8_t*uint8_t is not promoted to signed int.
      using U = std::conditional_t<(sizeof(A) < 4), uint32_t, std::make_unsigned_t<A>>;
      return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    } else {
      return a * b;
    }
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
  using E = Elem<DT>;
  using S = typename E::S;
  using A = typename E::A;
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
  switch (dtype) {
    case SP_FLOAT32: return reduce_for_op<SP_FLOAT32>(op);
    case SP_FLOAT64: return reduce_for_op<SP_FLOAT64>(op);
    case SP_FLOAT16: return reduce_for_op<SP_FLOAT16>(op);
    case SP_BFLOAT16: return reduce_for_op<SP_BFLOAT16>(op);
    case SP_INT8: return reduce_for_op<SP_INT8>(op);
    case SP_UINT8: return reduce_for_op<SP_UINT8>(op);
    case SP_INT32: return reduce_for_op<SP_INT32>(op);
    case SP_INT64: return reduce_for_op<SP_INT64>(op);
    default: return nullptr;
  }
}

inline size_t dtype_size(int dtype) {
  switch (dtype) {
    case SP_FLOAT32: return 4;
    case SP_FLOAT64: return 8;
    case SP_FLOAT16: return 2;
    case SP_BFLOAT16: return 2;
    case SP_INT8: return 1;
    case SP_UINT8: return 1;
    case SP_INT32: return 4;
    case SP_INT64: return 8;
    default: return 0;
  }
}

inline const char* dtype_name(int dtype) {
  switch (dtype) {
    case SP_FLOAT32: return "float32";
    case SP_FLOAT64: return "float64";
    case SP_FLOAT16: return "float16";
    case SP_BFLOAT16: return "bfloat16";
    case SP_INT8: return "int8";
    case SP_UINT8: return "uint8";
    case SP_INT32: return "int32";
    case SP_INT64: return "int64";
    default: return "unknown dtype";
  }
}

}  // namespace sp_local
