#pragma once
// One rank's end of whatever a series measures: a plugin communicator, the
// shared-memory roofline, or a raw library (gloo, MPI). The sweep (sweep.h)
// only sees this interface, so every series is timed by the same loop.
#include <cstddef>
#include <cstdint>
#include <string>

#include "collective.h"

namespace shardplan_bench {

// One call. In-place layouts follow nccl-tests (and abi/comm.h): send and
// recv are the same buffer, except that all_gather's send is this rank's
// block of recv and reduce_scatter's recv is this rank's block of send.
struct Call {
  Collective coll = Collective::AllReduce;
  bool in_place = false;
  void* send = nullptr;
  uint64_t send_count = 0;
  void* recv = nullptr;
  uint64_t recv_count = 0;
};

class Rank {
 public:
  virtual ~Rank() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Runs `c` to completion (GPU work included). Returns 0, or
  // SP_ERR_UNSUPPORTED when the backend cannot do this collective, mode or
  // dtype (then it is reported as not measured); throws std::runtime_error
  // on any other failure.
  virtual int run(const Call& c) = 0;
  virtual std::string last_error() const { return {}; }
  // References implement all_reduce only.
  virtual bool supports(Collective) const { return true; }
  // The roofline leaves the sum on rank 0 only: there is nothing to verify.
  virtual bool checkable() const { return true; }
  // Called on every rank after a successful sweep, before the rank goes away.
  virtual void finish() {}

  // Buffers: host memory (64-byte aligned, pages touched) unless the
  // backend works on GPU memory.
  virtual bool on_host() const { return true; }
  virtual void* alloc(size_t bytes);
  virtual void release(void* p);
  virtual void upload(void* dst, const void* host, size_t bytes);
  virtual void download(void* host, const void* src, size_t bytes);
};

}  // namespace shardplan_bench
