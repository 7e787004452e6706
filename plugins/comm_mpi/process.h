#pragma once
// MPI in this process, shared by every communicator: whether and how it was
// initialised, the lock MPI_THREAD_SERIALIZED asks for, and what must be
// settled before finalizing it at exit.
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace sp_mpi {

struct Global {
  // Atomic, not under mu: BusyScope brackets every operation, and two mutex
  // round trips per call were a measurable part of a small all_reduce.
  std::atomic<bool> finalized{false};  // by us at exit; no MPI call may start after it
  std::atomic<int> busy{0};            // threads between BusyScope's entry and exit
  std::mutex mu;  // guards everything below
  bool ready = false;
  bool we_initialised = false;
  int thread_level = MPI_THREAD_SINGLE;
  int world_rank = 0;
  int world_size = 1;
  int tag_ub = 32767;  // MPI's guaranteed minimum, until asked
  MPI_Op half_ops[2][4] = {};  // [bfloat16?][sp_reduce_op]
  std::vector<MPI_Request> abandoned;
  std::vector<std::vector<uint8_t>> graveyard;  // temporaries abandoned requests may still touch
};

inline Global& global() {
  // Never destroyed: worker threads and the exit handler may outlive statics.
  static Global* g = new Global;
  return *g;
}

// Set once before the first communicator exists, read-only afterwards.
inline bool g_serialize = false;
inline std::mutex g_call_mu;

// What MPI_THREAD_SERIALIZED asks of us.
class MpiLock {
 public:
  MpiLock() {
    if (g_serialize) lock_ = std::unique_lock<std::mutex>(g_call_mu);
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

// Brackets every stretch of MPI calls, so the exit handler can tell whether
// finalizing would pull MPI from under a running operation.
class BusyScope {
 public:
  // Enter, then look at the door; finalize_at_exit closes the door, then
  // looks for anyone inside (both sequentially consistent), so at least one
  // of the two sees the other.
  BusyScope() {
    Global& g = global();
    g.busy.fetch_add(1);
    ok_ = !g.finalized.load();
    if (!ok_) g.busy.fetch_sub(1);
  }
  ~BusyScope() {
    if (ok_) global().busy.fetch_sub(1);
  }
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;
  bool ok() const { return ok_; }

 private:
  bool ok_ = false;
};

// A request given up on, and a temporary it may still touch, stay with MPI
// for good; finalize_at_exit tests the requests.
void abandon(MPI_Request* reqs, int n, std::vector<uint8_t>* keep);

int ensure_mpi(const std::string& who);

}  // namespace sp_mpi
