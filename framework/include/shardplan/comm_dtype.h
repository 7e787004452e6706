// sp_dtype for communication plugins that touch buffer elements themselves
// (CPU reductions, byte counts, error messages).
//
// Header-only, C++17, and free of torch and of any transport library, so a
// comm plugin still links nothing but shardplan::abi and every backend (and
// the conformance suite) agrees on the same bits. The half conversions are
// written out rather than taken from F16C or compiler half types so a plugin
// runs on any x86-64 or aarch64 host; they round to nearest even like torch,
// which is what a half-precision add/mul on a GPU gives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "shardplan/abi/comm.h"

namespace shardplan {
namespace comm {

namespace detail {
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
}  // namespace detail

// Branch-light IEEE half conversions after F. Giesen's public-domain half.c.
inline float f16_to_float(uint16_t h) {
  using detail::bits_of;
  using detail::float_of;
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

// Overflow becomes Inf; a NaN becomes the quiet NaN 0x7e00 with its sign, as
// torch's conversion gives.
inline uint16_t float_to_f16(float value) {
  using detail::bits_of;
  using detail::float_of;
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

inline float bf16_to_float(uint16_t h) { return detail::float_of(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float value) {
  const uint32_t u = detail::bits_of(value);
  // Rounding a NaN could carry into the exponent and yield infinity.
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// What a buffer of dtype DT holds (`storage`) and what arithmetic on its
// elements runs in (`compute`): C++ has no half types to compute in, so the
// half dtypes are widened to float by load() and rounded back by store().
template <int32_t DT>
struct dtype_traits;

namespace detail {
template <class T>
struct native_traits {
  using storage = T;
  using compute = T;
  static T load(T v) { return v; }
  static T store(T v) { return v; }
};
template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
struct half_traits {
  using storage = uint16_t;
  using compute = float;
  static float load(uint16_t v) { return Load(v); }
  static uint16_t store(float v) { return Store(v); }
};
}  // namespace detail

template <> struct dtype_traits<SP_FLOAT32> : detail::native_traits<float> {
  static constexpr const char* name = "float32";
};
template <> struct dtype_traits<SP_FLOAT64> : detail::native_traits<double> {
  static constexpr const char* name = "float64";
};
template <> struct dtype_traits<SP_FLOAT16> : detail::half_traits<&f16_to_float, &float_to_f16> {
  static constexpr const char* name = "float16";
};
template <> struct dtype_traits<SP_BFLOAT16> : detail::half_traits<&bf16_to_float, &float_to_bf16> {
  static constexpr const char* name = "bfloat16";
};
template <> struct dtype_traits<SP_INT8> : detail::native_traits<int8_t> {
  static constexpr const char* name = "int8";
};
template <> struct dtype_traits<SP_UINT8> : detail::native_traits<uint8_t> {
  static constexpr const char* name = "uint8";
};
template <> struct dtype_traits<SP_INT32> : detail::native_traits<int32_t> {
  static constexpr const char* name = "int32";
};
template <> struct dtype_traits<SP_INT64> : detail::native_traits<int64_t> {
  static constexpr const char* name = "int64";
};

template <int32_t DT>
using dtype_constant = std::integral_constant<int32_t, DT>;

// The one switch over sp_dtype: calls f(dtype_constant<DT>{}) for the runtime
// `dtype`, so code generic over the element type (a kernel table, a size) is
// written once per plugin instead of once per dtype. `unknown` is returned for
// a value outside sp_dtype; buffers come from callers and are not trusted.
template <class F, class R>
R visit_dtype(int32_t dtype, F&& f, R unknown) {
  switch (dtype) {
    case SP_FLOAT32: return f(dtype_constant<SP_FLOAT32>{});
    case SP_FLOAT64: return f(dtype_constant<SP_FLOAT64>{});
    case SP_FLOAT16: return f(dtype_constant<SP_FLOAT16>{});
    case SP_BFLOAT16: return f(dtype_constant<SP_BFLOAT16>{});
    case SP_INT8: return f(dtype_constant<SP_INT8>{});
    case SP_UINT8: return f(dtype_constant<SP_UINT8>{});
    case SP_INT32: return f(dtype_constant<SP_INT32>{});
    case SP_INT64: return f(dtype_constant<SP_INT64>{});
    default: return unknown;
  }
}

// 0 for an unknown dtype, which is how plugins validate a buffer's dtype.
inline size_t dtype_size(int32_t dtype) {
  return visit_dtype(
      dtype, [](auto dt) { return sizeof(typename dtype_traits<decltype(dt)::value>::storage); }, size_t{0});
}

inline const char* dtype_name(int32_t dtype) {
  return visit_dtype(
      dtype, [](auto dt) { return dtype_traits<decltype(dt)::value>::name; }, "unknown dtype");
}

// Integer sums and products wrap around (two's complement), as torch's do,
// instead of overflowing (undefined behaviour): unsigned arithmetic of at
// least 32 bits, so that narrow types are not promoted to int. Every plugin
// that reduces integers itself uses these, so they all agree.
template <typename T>
using Wrapping = std::conditional_t<(sizeof(T) < 4), uint32_t, std::make_unsigned_t<T>>;
template <typename T>
inline T wrapping_add(T a, T b) {
  return static_cast<T>(static_cast<Wrapping<T>>(static_cast<Wrapping<T>>(a) + static_cast<Wrapping<T>>(b)));
}
template <typename T>
inline T wrapping_mul(T a, T b) {
  return static_cast<T>(static_cast<Wrapping<T>>(static_cast<Wrapping<T>>(a) * static_cast<Wrapping<T>>(b)));
}

inline const char* reduce_op_name(int32_t op) {
  switch (op) {
    case SP_SUM: return "sum";
    case SP_MAX: return "max";
    case SP_MIN: return "min";
    case SP_PROD: return "prod";
    default: return "?";
  }
}

}  // namespace comm
}  // namespace shardplan
