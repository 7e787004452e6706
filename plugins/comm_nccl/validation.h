#pragma once
// Argument checks of the ABI's calls, each failure a one-line message.
#include <cstdint>
#include <string>

#include "comm.h"
#include "nccl_support.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_dtype.h"
#include "shardplan/comm_plugin.h"

namespace sp_nccl {

using shardplan::comm::dtype_name;

inline int check_comm(const char* op, sp_comm* comm) {
  if (!comm || !comm->impl) return fail(SP_ERR_INVALID, std::string("nccl ") + op + ": NULL communicator");
  if (comm->impl->aborted)
    return fail(SP_ERR_ABORTED, comm->impl->what(op) + ": the communicator was aborted");
  return SP_OK;
}

inline int check_buffer(const Comm& c, const char* op, const char* which, const sp_buffer* b) {
  auto context = [&] { return c.what(op); };
  if (int rc = shardplan::comm::check_device_buffer(
          SP_DEVICE_CUDA, "is a CPU buffer; the nccl backend moves CUDA device memory only (use gloo for CPU)", which, b,
          context))
    return rc;
  if (b->device_index != c.device)
    return fail(SP_ERR_INVALID, context() + ": " + which + " is on cuda:" + std::to_string(b->device_index) +
                                    " but this communicator uses cuda:" + std::to_string(c.device));
  return SP_OK;
}

inline int check_pair(const Comm& c, const char* op, const sp_buffer* send, const sp_buffer* recv) {
  int rc = check_buffer(c, op, "send", send);
  if (rc == SP_OK) rc = check_buffer(c, op, "recv", recv);
  if (rc == SP_OK && send->dtype != recv->dtype)
    rc = fail(SP_ERR_INVALID, c.what(op) + ": send is " + dtype_name(send->dtype) + " but recv is " +
                                  dtype_name(recv->dtype));
  return rc;
}

inline int count_mismatch(const Comm& c, const char* op, const std::string& what) {
  return fail(SP_ERR_INVALID, c.what(op) + ": " + what);
}

inline int check_root(const Comm& c, const char* op, int32_t root) {
  if (root < 0 || root >= c.size)
    return fail(SP_ERR_INVALID, c.what(op) + ": root " + std::to_string(root) + " is outside the group of " +
                                    std::to_string(c.size));
  return SP_OK;
}

inline ncclDataType_t dt_of(const sp_buffer& b) {
  ncclDataType_t t = ncclFloat32;
  nccl_dtype(b.dtype, &t);  // validated before
  return t;
}

}  // namespace sp_nccl
