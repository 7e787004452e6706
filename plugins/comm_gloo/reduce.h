#pragma once
// Element-wise reductions for every dtype of the comm ABI, in the shape gloo
// wants for AllreduceOptions::Func: c[i] = a[i] op b[i], where c may alias a
// or b. Half types are reduced in float and rounded to nearest even, which is
// what a pairwise half-precision add/mul on a GPU gives.
#include <gloo/types.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "shardplan/abi/comm.h"

namespace sp_gloo {

using ReduceFn = void (*)(void* c, const void* a, const void* b, size_t n);

inline size_t dtype_size(int32_t dtype) {
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

inline const char* dtype_name(int32_t dtype) {
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

inline float bf16_to_float(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  // Rounding a NaN could carry into the exponent and yield infinity.
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// x != x is only true for NaN; it keeps max/min NaN-propagating like torch,
// and folds away for integers.
struct OpSum {
  template <typename T> static T apply(T a, T b) { return static_cast<T>(a + b); }
};
struct OpProd {
  template <typename T> static T apply(T a, T b) { return static_cast<T>(a * b); }
};
struct OpMax {
  template <typename T> static T apply(T a, T b) { return (a > b || a != a) ? a : b; }
};
struct OpMin {
  template <typename T> static T apply(T a, T b) { return (a < b || a != a) ? a : b; }
};

template <typename T, typename Op>
void reduce_plain(void* c_, const void* a_, const void* b_, size_t n) {
  T* c = static_cast<T*>(c_);
  const T* a = static_cast<const T*>(a_);
  const T* b = static_cast<const T*>(b_);
  for (size_t i = 0; i < n; ++i) c[i] = Op::apply(a[i], b[i]);
}

template <typename Op>
void reduce_fp16(void* c_, const void* a_, const void* b_, size_t n) {
  auto* c = static_cast<gloo::float16*>(c_);
  auto* a = static_cast<const gloo::float16*>(a_);
  auto* b = static_cast<const gloo::float16*>(b_);
  for (size_t i = 0; i < n; ++i)
    c[i] = gloo::cpu_float2half_rn(Op::apply(gloo::cpu_half2float(a[i]), gloo::cpu_half2float(b[i])));
}

template <typename Op>
void reduce_bf16(void* c_, const void* a_, const void* b_, size_t n) {
  auto* c = static_cast<uint16_t*>(c_);
  auto* a = static_cast<const uint16_t*>(a_);
  auto* b = static_cast<const uint16_t*>(b_);
  for (size_t i = 0; i < n; ++i) c[i] = float_to_bf16(Op::apply(bf16_to_float(a[i]), bf16_to_float(b[i])));
}

template <typename Op>
ReduceFn reduce_for_dtype(int32_t dtype) {
  switch (dtype) {
    case SP_FLOAT32: return &reduce_plain<float, Op>;
    case SP_FLOAT64: return &reduce_plain<double, Op>;
    case SP_FLOAT16: return &reduce_fp16<Op>;
    case SP_BFLOAT16: return &reduce_bf16<Op>;
    case SP_INT8: return &reduce_plain<int8_t, Op>;
    case SP_UINT8: return &reduce_plain<uint8_t, Op>;
    case SP_INT32: return &reduce_plain<int32_t, Op>;
    case SP_INT64: return &reduce_plain<int64_t, Op>;
    default: return nullptr;
  }
}

// nullptr for an unknown dtype or op.
inline ReduceFn reduce_fn(int32_t dtype, int32_t op) {
  switch (op) {
    case SP_SUM: return reduce_for_dtype<OpSum>(dtype);
    case SP_PROD: return reduce_for_dtype<OpProd>(dtype);
    case SP_MAX: return reduce_for_dtype<OpMax>(dtype);
    case SP_MIN: return reduce_for_dtype<OpMin>(dtype);
    default: return nullptr;
  }
}

}  // namespace sp_gloo
