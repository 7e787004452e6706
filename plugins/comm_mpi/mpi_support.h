#pragma once
// The ABI in MPI's terms: error codes as messages, dtypes as MPI datatypes,
// reduce ops as MPI_Ops (our own for half precision), counts as C ints.
#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

#include "process.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_dtype.h"
#include "shardplan/comm_plugin.h"

namespace sp_mpi {

using shardplan::comm::dtype_size;
using shardplan::comm::dtype_traits;
using shardplan::comm::fail;
using shardplan::comm::overlaps;

inline std::string mpi_error(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<size_t>(len));
}

template <int32_t DT, int32_t OP>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  using T = dtype_traits<DT>;
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0, n = *len; i < n; ++i) {
    const float x = T::load(a[i]), y = T::load(b[i]);
    float r;
    switch (OP) {
      case SP_SUM: r = x + y; break;
      case SP_PROD: r = x * y; break;
      case SP_MAX: r = x > y ? x : y; break;
      default: r = x < y ? x : y; break;
    }
    b[i] = T::store(r);
  }
}

template <int32_t DT>
int create_half_ops(MPI_Op* ops) {
  MPI_User_function* fns[4] = {&half_reduce<DT, SP_SUM>, &half_reduce<DT, SP_MAX>, &half_reduce<DT, SP_MIN>,
                               &half_reduce<DT, SP_PROD>};
  for (int i = 0; i < 4; ++i)
    if (int rc = MPI_Op_create(fns[i], 1, &ops[i])) return rc;
  return MPI_SUCCESS;
}

inline MPI_Datatype mpi_type(int32_t dtype) {
  switch (dtype) {
    case SP_FLOAT32: return MPI_FLOAT;
    case SP_FLOAT64: return MPI_DOUBLE;
    // MPI has no half types; moving them needs only their size, reducing
    // them goes through our own MPI_Op.
    case SP_FLOAT16:
    case SP_BFLOAT16: return MPI_UINT16_T;
    case SP_INT8: return MPI_INT8_T;
    case SP_UINT8: return MPI_UINT8_T;
    case SP_INT32: return MPI_INT32_T;
    default: return MPI_INT64_T;
  }
}

inline MPI_Op mpi_op(int32_t dtype, int32_t op) {
  if (dtype == SP_FLOAT16 || dtype == SP_BFLOAT16) return global().half_ops[dtype == SP_BFLOAT16][op];
  switch (op) {
    case SP_SUM: return MPI_SUM;
    case SP_MAX: return MPI_MAX;
    case SP_MIN: return MPI_MIN;
    default: return MPI_PROD;
  }
}

inline uint8_t* bytes(const sp_buffer& b, size_t offset = 0) { return static_cast<uint8_t*>(b.data) + offset; }

// MPI counts are C ints.
constexpr uint64_t kMaxCount = static_cast<uint64_t>(INT_MAX);

}  // namespace sp_mpi
