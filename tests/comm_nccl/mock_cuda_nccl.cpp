// A stand-in for the parts of the CUDA runtime and NCCL that the nccl plugin
// and its tests call, for machines without a GPU (CI): LD_PRELOADed, its
// unversioned definitions take the place of libcudart's and libnccl's.
//
// One device whose memory is host memory; every stream operation runs at once
// on the calling thread, so events are always complete. NCCL is one rank
// (world size 1) and strict where real NCCL is undefined: overlapping
// buffers other than NCCL's in-place forms, a send or recv to self that is
// not matched inside the same group, and nonblocking calls used before they
// settled are reported as errors. Nonblocking calls answer ncclInProgress for
// a few polls, so the plugin's waiting paths run too.
//
// This proves the plugin's logic (validation, staging, grouping of point to
// point, work handles, split, abort) against the conformance suite; stream
// ordering and real multi-rank behaviour need a GPU.
#include <cuda_bf16.h>  // before nccl.h, for ncclBfloat16 (see comm_nccl.cpp)
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>

namespace {

thread_local std::string t_nccl_error;
int g_device = 0;

bool overlap(const void* a, size_t an, const void* b, size_t bn) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return an && bn && pa < pb + bn && pb < pa + an;
}

void copy(void* dst, const void* src, size_t n, const char* who) {
  if (dst == src || n == 0) return;
  if (overlap(dst, n, src, n)) {
    std::fprintf(stderr, "mock_cuda_nccl: %s copies between overlapping ranges\n", who);
    std::abort();
  }
  std::memcpy(dst, src, n);
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

}  // namespace

// ------------------------------------------------------------- CUDA runtime

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = g_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  g_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  std::memset(prop, 0, sizeof *prop);
  std::strcpy(prop->name, "mock device (host memory)");
  return cudaSuccess;
}
const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorMock"; }
const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "mock CUDA error"; }

cudaError_t cudaMalloc(void** p, size_t n) {
  *p = std::aligned_alloc(256, (n + 255) / 256 * 256 + 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t) { return cudaMalloc(p, n); }
cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }
cudaError_t cudaMemset(void* p, int v, size_t n) {
  std::memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t) {
  copy(dst, src, n, "cudaMemcpyAsync");
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  *s = reinterpret_cast<cudaStream_t>(new char(0));
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<char*>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned int) {
  return e ? cudaSuccess : cudaErrorInvalidResourceHandle;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = reinterpret_cast<cudaEvent_t>(new char(0));
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<char*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) { return e ? cudaSuccess : cudaErrorInvalidResourceHandle; }
cudaError_t cudaEventQuery(cudaEvent_t e) { return e ? cudaSuccess : cudaErrorInvalidResourceHandle; }

}  // extern "C"

// --------------------------------------------------------------------- NCCL

struct ncclComm {
  bool blocking = true;
  int in_progress = 0;  // polls left before a nonblocking call settles
  bool aborted = false;
  // A nonblocking split as NCCL 2.28 does it: the parent reads ready while the
  // new communicator is still being made and handed over to *split_out a few
  // polls later; until then the parent refuses calls as still in progress.
  int split_polls = 0;
  ncclComm_t split_child = nullptr;
  ncclComm_t* split_out = nullptr;
};

namespace {

struct P2P {
  bool is_send;
  void* data;
  size_t bytes;
};

int g_group_depth = 0;
std::deque<P2P> g_sends, g_recvs;  // within the open group
ncclComm_t g_group_comm = nullptr;  // the one the open group uses

ncclResult_t error(ncclResult_t r, const std::string& msg) {
  t_nccl_error = msg;
  return r;
}

// A nonblocking communicator answers "in progress" for two polls after each
// call that real NCCL may leave in progress.
ncclResult_t started(ncclComm_t c) {
  if (c->blocking) return ncclSuccess;
  c->in_progress = 2;
  return ncclInProgress;
}

ncclResult_t usable(ncclComm_t c, const char* who) {
  if (!c) return error(ncclInvalidArgument, std::string(who) + ": NULL communicator");
  if (c->aborted) return error(ncclInvalidUsage, std::string(who) + ": communicator was aborted");
  if (c->in_progress > 0 || c->split_polls > 0)
    return error(ncclInvalidUsage, std::string(who) + ": called while the communicator is in progress");
  return ncclSuccess;
}

ncclResult_t one_rank_copy(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t c,
                           const char* who) {
  if (ncclResult_t r = usable(c, who)) return r;
  const size_t n = count * type_size(t);
  if (n && type_size(t) == 0) return error(ncclInvalidArgument, std::string(who) + ": bad datatype");
  if (send != recv && overlap(send, n, recv, n))
    return error(ncclInvalidArgument, std::string(who) + ": send and recv overlap without being in place");
  copy(recv, send, n, who);
  if (g_group_depth) {
    g_group_comm = c;
    return ncclSuccess;
  }
  return started(c);
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclInvalidArgument: return "invalid argument (mock)";
    case ncclInvalidUsage: return "invalid usage (mock)";
    default: return "mock NCCL error";
  }
}
const char* ncclGetLastError(ncclComm_t) { return t_nccl_error.c_str(); }
ncclResult_t ncclGetVersion(int* v) {
  *v = NCCL_VERSION_CODE;
  return ncclSuccess;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0x42, sizeof *id);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId, int rank, ncclConfig_t* config) {
  if (nranks != 1 || rank != 0) return error(ncclInvalidArgument, "the mock has one rank only");
  *comm = new ncclComm;
  (*comm)->blocking = !config || config->blocking != 0;
  return started(*comm);
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (ncclResult_t r = usable(comm, "ncclCommSplit")) return r;
  *newcomm = nullptr;
  if (color == NCCL_SPLIT_NOCOLOR) return started(comm);
  ncclComm_t child = new ncclComm;
  child->blocking = !config || config->blocking != 0;
  started(child);
  if (comm->blocking) {
    *newcomm = child;
    return ncclSuccess;
  }
  comm->split_polls = 3;
  comm->split_child = child;
  comm->split_out = newcomm;
  return ncclInProgress;
}
#endif
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* r) {
  if (!comm) return ncclInvalidArgument;
  if (comm->split_polls > 0 && --comm->split_polls == 0)
    __atomic_store_n(comm->split_out, comm->split_child, __ATOMIC_RELEASE);
  if (comm->in_progress > 0) --comm->in_progress;
  *r = comm->in_progress > 0 ? ncclInProgress : ncclSuccess;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t, int* rank) {
  *rank = 0;
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t, int* count) {
  *count = 1;
  return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (ncclResult_t r = usable(comm, "ncclCommFinalize")) return r;
  return started(comm);
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm && comm->in_progress > 0) {
    std::fprintf(stderr, "mock_cuda_nccl: ncclCommDestroy while in progress\n");
    std::abort();
  }
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t, ncclComm_t c,
                           cudaStream_t) {
  return one_rank_copy(s, r, n, t, c, "ncclAllReduce");
}
ncclResult_t ncclAllGather(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t) {
  return one_rank_copy(s, r, n, t, c, "ncclAllGather");
}
ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t, ncclComm_t c,
                               cudaStream_t) {
  return one_rank_copy(s, r, n, t, c, "ncclReduceScatter");
}
ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t) {
  if (root != 0) return error(ncclInvalidArgument, "ncclBroadcast: root outside the one-rank group");
  return one_rank_copy(s, r, n, t, c, "ncclBroadcast");
}

ncclResult_t ncclGroupStart() {
  ++g_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t) {
  if (ncclResult_t r = usable(c, "ncclSend")) return r;
  if (peer != 0) return error(ncclInvalidArgument, "ncclSend: peer outside the one-rank group");
  if (!g_group_depth) return error(ncclInvalidUsage, "ncclSend to self outside a group would never be matched");
  g_sends.push_back(P2P{true, const_cast<void*>(s), n * type_size(t)});
  g_group_comm = c;
  return ncclSuccess;
}
ncclResult_t ncclRecv(void* r, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t) {
  if (ncclResult_t e = usable(c, "ncclRecv")) return e;
  if (peer != 0) return error(ncclInvalidArgument, "ncclRecv: peer outside the one-rank group");
  if (!g_group_depth) return error(ncclInvalidUsage, "ncclRecv from self outside a group would never be matched");
  g_recvs.push_back(P2P{false, r, n * type_size(t)});
  g_group_comm = c;
  return ncclSuccess;
}

// Matches sends to self with receives in issue order, as NCCL does.
ncclResult_t ncclGroupEnd() {
  if (g_group_depth == 0) return error(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g_group_depth > 0) return ncclSuccess;
  std::deque<P2P> sends, recvs;
  sends.swap(g_sends);
  recvs.swap(g_recvs);
  ncclComm_t c = g_group_comm;
  g_group_comm = nullptr;
  if (sends.size() != recvs.size())
    return error(ncclInvalidUsage, "group ends with " + std::to_string(sends.size()) + " sends to self but " +
                                       std::to_string(recvs.size()) + " receives");
  for (size_t i = 0; i < sends.size(); ++i) {
    if (sends[i].bytes != recvs[i].bytes)
      return error(ncclInvalidUsage, "send of " + std::to_string(sends[i].bytes) + " bytes matched with a recv of " +
                                         std::to_string(recvs[i].bytes));
    copy(recvs[i].data, sends[i].data, sends[i].bytes, "ncclSend/ncclRecv");
  }
  return c ? started(c) : ncclSuccess;
}

}  // extern "C"
