#pragma once
// Argument checks of the ABI's calls, each failure a one-line message.
#include <cstdint>
#include <string>

#include "comm.h"
#include "mpi_support.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_plugin.h"

namespace sp_mpi {

inline int check_buffer(const char* op, const char* which, const sp_buffer* b) {
  return shardplan::comm::check_cpu_buffer("mpi", op, which, b);
}

inline int check_pair(const char* op, const sp_buffer* send, const sp_buffer* recv) {
  return shardplan::comm::check_cpu_pair("mpi", op, send, recv);
}

inline int count_mismatch(const char* op, const std::string& what) {
  return fail(SP_ERR_INVALID, std::string("mpi ") + op + ": " + what);
}

// The count handed to MPI, which takes C ints.
inline int check_mpi_count(const char* op, uint64_t count) {
  if (count > kMaxCount)
    return fail(SP_ERR_UNSUPPORTED, std::string("mpi ") + op + ": " + std::to_string(count) +
                                        " elements per rank exceed MPI's int count (" + std::to_string(kMaxCount) +
                                        "); split the buffer");
  return SP_OK;
}

inline int check_comm(const char* op, sp_comm* comm) {
  if (!comm || !comm->impl) return fail(SP_ERR_INVALID, std::string("mpi ") + op + ": NULL communicator");
  std::string why = comm->impl->unusable();
  if (!why.empty()) return fail(SP_ERR_ABORTED, "mpi " + comm->impl->what(op) + ": " + why);
  return SP_OK;
}

inline int check_root(const char* op, const Comm& c, int32_t root) {
  if (root < 0 || root >= c.size)
    return fail(SP_ERR_INVALID, std::string("mpi ") + op + ": root " + std::to_string(root) +
                                    " is outside the group of " + std::to_string(c.size));
  return SP_OK;
}

inline int check_op(const char* op, int32_t reduce) {
  if (reduce < SP_SUM || reduce > SP_PROD)
    return fail(SP_ERR_INVALID, std::string("mpi ") + op + ": unknown reduce op " + std::to_string(reduce));
  return SP_OK;
}

}  // namespace sp_mpi
