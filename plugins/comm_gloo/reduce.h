#pragma once
// Element-wise reductions for every dtype of the comm ABI, in the shape gloo
// wants for AllreduceOptions::Func: c[i] = a[i] op b[i], where c may alias a
// or b. Half types are reduced in float and rounded to nearest even, which is
// what a pairwise half-precision add/mul on a GPU gives.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "shardplan/abi/comm.h"
#include "shardplan/comm_dtype.h"

namespace sp_gloo {

using ReduceFn = void (*)(void* c, const void* a, const void* b, size_t n);

// Integer sums and products wrap around (comm_dtype.h), as torch's and the
// local plugin's do.
struct OpSum {
  template <typename T> static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>)
      return shardplan::comm::wrapping_add(a, b);
    else
      return static_cast<T>(a + b);
  }
};
struct OpProd {
  template <typename T> static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>)
      return shardplan::comm::wrapping_mul(a, b);
    else
      return static_cast<T>(a * b);
  }
};
// x != x is only true for NaN; it keeps max/min NaN-propagating like torch,
// and folds away for integers.
struct OpMax {
  template <typename T> static T apply(T a, T b) { return (a > b || a != a) ? a : b; }
};
struct OpMin {
  template <typename T> static T apply(T a, T b) { return (a < b || a != a) ? a : b; }
};

template <int32_t DT, typename Op>
void reduce_elements(void* c_, const void* a_, const void* b_, size_t n) {
  using E = shardplan::comm::dtype_traits<DT>;
  using S = typename E::storage;
  S* c = static_cast<S*>(c_);
  const S* a = static_cast<const S*>(a_);
  const S* b = static_cast<const S*>(b_);
  for (size_t i = 0; i < n; ++i) c[i] = E::store(Op::apply(E::load(a[i]), E::load(b[i])));
}

template <typename Op>
ReduceFn reduce_for_dtype(int32_t dtype) {
  return shardplan::comm::visit_dtype(
      dtype, [](auto dt) -> ReduceFn { return &reduce_elements<decltype(dt)::value, Op>; }, ReduceFn{nullptr});
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
