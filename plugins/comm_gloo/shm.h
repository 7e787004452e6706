#pragma once
// Same-host fast path of the gloo plugin. When every rank of a communicator
// runs on one host (same boot, same IPC, PID and mount namespaces), its
// all_reduce, reduce_scatter and all_gather go through one shared memory
// segment instead of gloo's TCP loopback: each rank copies its data into its
// own slot, meets the others at a barrier of futex words, and reduces or
// copies straight from their slots. That is what NCCL's and Open MPI's
// shared-memory transports do, and it removes what a loopback message costs
// on a small machine: two copies through the kernel, a wake-up of gloo's
// network thread per message and its lock hand-off (docs/BENCHMARKS.md, "GPT
// example over gloo").
//
// Exactness: every element of a reduction is reduced by exactly one rank, in
// rank order, and copied to the others, so all ranks end with the same bits.
// Failure: a wait gives up after the communicator's timeout, at once when the
// communicator is aborted, and within ~100 ms when a peer process has died;
// after a failure the group refuses further operations (as a gloo context
// does after a timeout).
//
// Option shm=auto (default: use it when possible), shm=off (always TCP),
// shm=on (an error when it cannot be used); environment SHARDPLAN_GLOO_SHM
// (auto/on/off, 1/0) is the default for the option (env.h).
//
// Nothing is left in /dev/shm: the segment's name is unlinked as soon as
// every rank has mapped it, and on every way out of attach_shm before that
// (a peer died, /dev/shm is full). A rank killed outright inside that window
// runs no destructor, so the name carries the job (SHARDPLAN_JOB_ID, which
// shardplan launch exports) and the process that owns it (shm_names.h): the
// launcher removes its own job's names once its ranks are gone, and every
// launcher and rank at start the names whose owner is gone (a launcher
// killed with SIGKILL takes its ranks with it, and nobody else would).
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "reduce.h"

namespace sp_gloo {

class Comm;

enum class ShmMode { kAuto, kOn, kOff };

class ShmGroup {
 public:
  // Over an attached segment of `bytes` bytes at `base` (unmapped by the
  // destructor). `pids`: every rank's process, to notice one that died.
  ShmGroup(int rank, int size, std::chrono::milliseconds timeout, const std::atomic<bool>* aborted, void* base,
           size_t bytes, size_t slot_bytes, std::vector<int64_t> pids);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  // Buffers as the plugin's collectives get them (count elements of `es`
  // bytes; all_reduce: count in both, reduce_scatter: count per rank in
  // recv, all_gather: count in send). send may equal recv where the gloo
  // path allows it.
  void all_reduce(const uint8_t* send, uint8_t* recv, size_t count, size_t es, ReduceFn fn);
  void reduce_scatter(const uint8_t* send, uint8_t* recv, size_t count, size_t es, ReduceFn fn);
  void all_gather(const uint8_t* send, uint8_t* recv, size_t count, size_t es);
  // Tells the peers this rank will not come to another barrier (abort).
  void leave();

 private:
  struct Flag;
  uint8_t* slot(int rank) const;
  void barrier();
  void wait_for(int peer, uint32_t target, std::chrono::steady_clock::time_point deadline);
  void begin();

  const int rank_, size_;
  const std::chrono::milliseconds timeout_;
  const std::atomic<bool>* aborted_;
  uint8_t* base_;
  const size_t bytes_, slot_bytes_;
  const std::vector<int64_t> pids_;
  Flag* flags_;
  uint8_t* banks_;
  uint32_t epoch_ = 0;   // barriers passed; the same on every rank
  uint64_t chunks_ = 0;  // chunks moved; picks the bank
  bool broken_ = false;
  std::string broken_why_;
  std::chrono::steady_clock::time_point deadline_;
};

// "auto", "on", "off" (also 1/0, true/false); false for anything else.
bool parse_shm_mode(const std::string& v, ShmMode& out);
// What SHARDPLAN_JOB_ID may hold: it becomes part of a file name, and the
// launcher finds a job's segments by the prefix "shardplan-gloo-<job>-", so
// no '-' and no '/'.
bool valid_job_id(const std::string& v);

// Collective over `c` (every rank calls it right after connecting): attaches
// c.shm when all ranks share a host and the segment can be made, else leaves
// it empty on every rank alike. Throws when mode is kOn and it cannot be used.
void attach_shm(Comm& c, ShmMode mode);

}  // namespace sp_gloo
