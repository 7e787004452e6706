#pragma once
// What the whole plugin shares about CUDA and NCCL: their errors as a status
// and a message, the ABI's dtypes and reduce ops in NCCL's terms, the caller's
// current device, polling, completion events, and waiting out a nonblocking
// NCCL call. The plugin's other files get nccl.h through this header only,
// so that cuda_bf16.h always comes before it.

// Before nccl.h: older NCCL releases declare ncclBfloat16 only where
// __CUDA_BF16_TYPES_EXIST__ is defined, which this header does.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "shardplan/abi/comm.h"
#include "shardplan/comm_plugin.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "the nccl plugin needs NCCL 2.14 or newer (nonblocking communicators)"
#endif
// ncclCommSplit came with 2.18; before it, split meets through the store.
#define SP_NCCL_HAS_COMM_SPLIT (NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0))

namespace sp_nccl {

using Clock = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;
using shardplan::comm::fail;

inline std::string cuda_msg(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

inline std::string nccl_msg(ncclComm_t comm, ncclResult_t r) {
  std::string m = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) m += std::string(" (") + last + ")";
  return m;
}

inline int status_of(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return SP_OK;
    case ncclInvalidArgument:
    case ncclInvalidUsage: return SP_ERR_INVALID;
    default: return SP_ERR_INTERNAL;
  }
}

inline bool nccl_dtype(int32_t dt, ncclDataType_t* out) {
  switch (dt) {
    case SP_FLOAT32: *out = ncclFloat32; return true;
    case SP_FLOAT64: *out = ncclFloat64; return true;
    case SP_FLOAT16: *out = ncclFloat16; return true;
    case SP_BFLOAT16: *out = ncclBfloat16; return true;
    case SP_INT8: *out = ncclInt8; return true;
    case SP_UINT8: *out = ncclUint8; return true;
    case SP_INT32: *out = ncclInt32; return true;
    case SP_INT64: *out = ncclInt64; return true;
    default: return false;
  }
}

inline bool nccl_op(int32_t op, ncclRedOp_t* out) {
  switch (op) {
    case SP_SUM: *out = ncclSum; return true;
    case SP_MAX: *out = ncclMax; return true;
    case SP_MIN: *out = ncclMin; return true;
    case SP_PROD: *out = ncclProd; return true;
    default: return false;
  }
}

// The host thread's current device belongs to the caller (torch keeps its
// own notion of it); the plugin switches only for the duration of a call.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) == cudaSuccess && prev_ != device) cudaSetDevice(device);
    else prev_ = -1;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// Polls spin briefly before they sleep: an operation on idle GPUs often ends
// within microseconds, and a sleep would add the scheduler's latency to it.
class Backoff {
 public:
  void pause() {
    if (n_ < 200) {
      ++n_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(nap_);
    nap_ = std::min(nap_ * 2, std::chrono::microseconds(100));
  }

 private:
  int n_ = 0;
  std::chrono::microseconds nap_{20};
};

struct Event {
  explicit Event(int device) : device(device) {}
  ~Event() {
    if (ev) {
      DeviceGuard g(device);
      cudaEventDestroy(ev);
    }
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  const int device;
  cudaEvent_t ev = nullptr;
};

// NCCL's nonblocking calls return ncclInProgress until the communicator is
// ready for the next call. Gives up on `cancel` or at the deadline.
inline int settle(ncclComm_t comm, ncclResult_t r, Clock::time_point deadline, const std::atomic<bool>& cancel,
                  const std::atomic<bool>* cancel2, std::string* err) {
  Backoff backoff;
  while (r == ncclInProgress) {
    if (cancel || (cancel2 && *cancel2)) {
      *err = "the communicator was aborted";
      return SP_ERR_ABORTED;
    }
    if (Clock::now() > deadline) {
      *err = "NCCL did not finish the call within the communicator's timeout";
      return SP_ERR_TIMEOUT;
    }
    backoff.pause();
    ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) r = q;
  }
  if (r != ncclSuccess) {
    *err = nccl_msg(comm, r);
    return status_of(r);
  }
  return SP_OK;
}

}  // namespace sp_nccl
