#pragma once
// The issuing side of one operation: the stream and communicator it is
// enqueued on, private copies of inputs NCCL may not read in place, and NCCL
// groups that close even when an operation inside them is refused.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "nccl_support.h"

namespace sp_nccl {

// What an operation's issuing code may need beyond NCCL itself.
struct Launch {
  cudaStream_t stream = nullptr;
  ncclComm_t nccl = nullptr;
  std::string error;           // the first CUDA failure
  std::vector<void*> scratch;  // freed in stream order once the operation is enqueued

  bool cuda(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    if (error.empty()) error = std::string(what) + " failed: " + cuda_msg(e);
    return false;
  }
  // A private copy of an input that overlaps the output in a way NCCL does
  // not allow (NCCL's in-place forms only are safe).
  const void* stage(const void* src, size_t bytes) {
    void* p = nullptr;
    if (!cuda(cudaMallocAsync(&p, bytes, stream), "cudaMallocAsync")) return nullptr;
    scratch.push_back(p);
    if (!cuda(cudaMemcpyAsync(p, src, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync")) return nullptr;
    return p;
  }
  bool copy(void* dst, const void* src, size_t bytes) {
    if (dst == src || bytes == 0) return true;
    return cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
  }
};

// Closes a group even when an operation inside it was refused, as NCCL
// requires; reports the first failure.
template <typename Fn>
ncclResult_t grouped(Fn&& fn) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  r = fn();
  ncclResult_t e = ncclGroupEnd();
  return r != ncclSuccess ? r : e;
}

}  // namespace sp_nccl
