#pragma once
// Backend-independent conformance suite for communication plugins, driven
// through the raw C ABI (abi/comm.h) so it needs no libtorch.
//
// Every rank of a communicator calls run_conformance with the same options;
// the call issues the same sequence of operations on every rank and checks,
// on this rank only, the results against a reference computed locally. Inputs
// are small integers (a deterministic function of rank, index and a per-call
// salt), so sums and products are exact in every dtype, float16 and bfloat16
// included, and any summation order must give bit-identical results.
//
// Conventions exercised (they are the ones the framework relies on):
//  - in-place means send->data == recv->data for every collective; for the
//    rank-major ones (all_gather, reduce_scatter, scatter, gather) the
//    "block" in-place layout, where this rank's block of the big buffer is the
//    small one, is checked as well;
//  - non-roots of scatter/gather pass a dummy for the buffer they do not use,
//    as shardplan::Communicator does;
//  - sends may be eager or rendezvous: the blocking ring orders send/recv by
//    rank parity, so it cannot deadlock either way.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardplan/abi/comm.h"

namespace shardplan {
namespace conformance {

// Where the suite's buffers live: host memory unless `alloc` is set. A device
// backend's test supplies the callbacks (they throw on failure); the suite
// keeps a host copy of every buffer, uploads it before handing the buffer to
// the backend and downloads it before checking, so the checks stay host-side
// and this library needs no device runtime.
struct Memory {
  int32_t device_type = SP_DEVICE_CPU;  // put into every sp_buffer
  int32_t device_index = 0;
  void* stream = nullptr;
  std::function<void*(size_t bytes)> alloc;
  std::function<void(void* device)> free;
  std::function<void(void* device, const void* host, size_t bytes)> upload;
  std::function<void(void* host, const void* device, size_t bytes)> download;
};

struct Options {
  std::vector<uint64_t> counts{0, 1, 7, 1023, 65537};
  std::vector<int32_t> dtypes{SP_FLOAT32, SP_FLOAT64, SP_FLOAT16, SP_BFLOAT16,
                              SP_INT8,    SP_UINT8,   SP_INT32,   SP_INT64};
  bool block_in_place = true;  // the rank-major "block" in-place layouts
  bool p2p = true;
  bool p2p_tag_matching = true;  // receives out of send order by tag (NCCL has no tags)
  bool async = true;
  bool split = true;
  int64_t wait_timeout_ms = 120000;  // for wait() on async work
  size_t max_messages = 100;         // failures beyond this are counted, not described
  Memory memory;
};

struct Result {
  int passed = 0;
  int failed = 0;
  std::vector<std::string> failures;  // "rank R: <check>: <what went wrong>"
  bool ok() const { return failed == 0; }
};

// Collective over `comm`: every rank must call it with equal options.
// Returns this rank's view.
Result run_conformance(const sp_comm_api* api, sp_comm* comm, const Options& options = Options());

}  // namespace conformance
}  // namespace shardplan
