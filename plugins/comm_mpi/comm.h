#pragma once
// One communicator: its duplicates of the MPI group, the in-order queue its
// operations run through, and the polling that lets an MPI request time out
// or be aborted.
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mpi_support.h"
#include "process.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_plugin.h"
#include "shardplan/comm_worker.h"

namespace sp_mpi {
class Comm;
}  // namespace sp_mpi

struct sp_comm {
  std::shared_ptr<sp_mpi::Comm> impl;
};

namespace sp_mpi {

using Clock = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;

// Polling: back to back at first, as MPI's own blocking calls do, so a short
// operation completes with MPI's latency; then short sleeps, so a rank
// waiting minutes for a slow peer does not burn a core. No sched_yield()
// phase: on a contended core a yield hands over a whole time slice (measured:
// p50 of a 16-byte MPI_Iallreduce polled with yields 4 ms under load, polled
// back to back 0.8 us). MPI progresses only inside our MPI_Test calls, so the
// sleeps must stay short for a large transfer that is under way.
constexpr auto kBusyFor = ms(50);
constexpr auto kNapShort = std::chrono::microseconds(50);
constexpr auto kNapLong = std::chrono::microseconds(500);
constexpr auto kNapLongAfter = ms(2000);

class Comm {
 public:
  using Run = std::function<int(std::string& err)>;

  Comm(MPI_Comm mc, int rank, int size, ms timeout) : mc(mc), rank(rank), size(size), timeout(timeout) {}

  ~Comm() {
    queue_.stop();
    // Freeing a communicator an abandoned request still uses is legal but
    // would only invite MPI to touch it again; it is leaked instead.
    if (given_up_.load() || mc == MPI_COMM_NULL) return;
    BusyScope busy;
    int fin = 0;
    MPI_Finalized(&fin);
    if (busy.ok() && !fin) {
      MpiLock lock;
      MPI_Comm_free(&mc);
      if (own_mc != MPI_COMM_NULL) MPI_Comm_free(&own_mc);
    }
  }

  MPI_Comm mc;
  // The same group, for the messages of the algorithms we run ourselves
  // (OwnAllReduce): apart from the user's send/recv on mc, whatever
  // their tags.
  MPI_Comm own_mc = MPI_COMM_NULL;
  // OwnAllReduce's receive buffer, kept between operations (they run one at
  // a time) rather than allocated per call. Given to MPI for good, like any
  // temporary, when an operation using it is abandoned.
  std::vector<uint8_t> scratch;
  const int rank;
  const int size;
  const ms timeout;
  std::atomic<bool> aborted{false};
  // The operation whose timeout made this communicator unusable (a literal).
  std::atomic<const char*> timed_out{nullptr};

  std::string what(const char* op) const {
    return std::string(op) + " on rank " + std::to_string(rank) + " of " + std::to_string(size);
  }

  // Empty when the communicator may still be used.
  std::string unusable() const {
    if (aborted) return "the communicator was aborted";
    if (const char* op = timed_out.load())
      return std::string("an earlier ") + op +
             " timed out and MPI cannot cancel it, so this communicator takes no further operations";
    return {};
  }

  // Polls `reqs` until all are done, the communicator's timeout passes since
  // `start`, or it is aborted. On giving up the requests (and `keep`) stay
  // with MPI for good.
  int complete(const char* op, MPI_Request* reqs, int n, std::string& err, MPI_Status* status = nullptr,
               std::vector<uint8_t>* keep = nullptr) {
    // The clock is read from the first unfinished test on: a small
    // operation often completes at once, and clock reads showed in profiles.
    Clock::time_point start, deadline;
    bool timing = false;
    for (;;) {
      int flag = 0, rc;
      {
        MpiLock lock;
        rc = n == 1 ? MPI_Test(reqs, &flag, status ? status : MPI_STATUS_IGNORE)
                    : MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE);
      }
      if (rc != MPI_SUCCESS) {
        int cls = MPI_ERR_OTHER;
        MPI_Error_class(rc, &cls);
        err = mpi_error(rc);
        return cls == MPI_ERR_TRUNCATE ? SP_ERR_INVALID : SP_ERR_INTERNAL;
      }
      if (flag) return SP_OK;
      const auto now = Clock::now();
      if (!timing) {
        timing = true;
        start = now;
        deadline = start + timeout;
      }
      if (aborted) {
        give_up(reqs, n, keep);
        err = "the communicator was aborted while waiting for peers (MPI cannot cancel the operation)";
        return SP_ERR_ABORTED;
      }
      if (now >= deadline) {
        give_up(reqs, n, keep);
        const char* expected = nullptr;
        timed_out.compare_exchange_strong(expected, op);
        err = "timed out after " + std::to_string(timeout.count()) +
              " ms waiting for peers (a peer is stuck, gone, or issued different operations)";
        return SP_ERR_TIMEOUT;
      }
      const auto waited = now - start;
      if (waited < kBusyFor) continue;
      std::this_thread::sleep_for(waited < kNapLongAfter ? kNapShort : kNapLong);
    }
  }

  // Runs `run` in issue order. work == nullptr: blocks and returns its status.
  // `posted`: a request posted at issue time that `run` completes; it is
  // abandoned if `run` never gets to it.
  template <class F>
  int submit(const char* op, F&& run, sp_work** work, std::shared_ptr<MPI_Request> posted = nullptr) {
    const shardplan::comm::OpInfo info{"mpi", op, rank, size, timeout};
    int status;
    if (!work && queue_.run_inline(info, [&](std::string& err) { return execute(run, posted, err); }, &status))
      return status;
    return queue_.submit(info, Task{Run(std::forward<F>(run)), std::move(posted)}, work);
  }

  // Runs `run` on the calling thread at once, whatever is queued ahead: for
  // a blocking receive already posted, whose completion needs its own
  // message only. Queued, it would first wait for this rank's earlier sends
  // to be matched, which may need the peer to get further first: two ranks
  // that send to each other and then receive (an interleaved pipeline's
  // chunks, shardplan/pipeline.h) would each wait for the other.
  template <class F>
  int run_now(const char* op, F&& run, const std::shared_ptr<MPI_Request>& posted) {
    std::string err;
    const int status = execute(run, posted, err);
    if (status != SP_OK)
      shardplan::comm::last_error() = shardplan::comm::OpInfo{"mpi", op, rank, size, timeout}.what() + ": " + err;
    return status;
  }

  void abort() {
    aborted = true;
    children.abort_all();
  }

  shardplan::comm::Children<Comm> children;

  void give_up(MPI_Request* reqs, int n, std::vector<uint8_t>* keep) {
    given_up_ = true;
    abandon(reqs, n, keep);
  }

 private:
  // What submit() was given.
  struct Task {
    Run run;
    std::shared_ptr<MPI_Request> posted;
  };

  template <class F>
  int execute(F& run, const std::shared_ptr<MPI_Request>& posted, std::string& err) {
    int status = SP_OK;
    err = unusable();
    BusyScope busy;
    if (!err.empty()) {
      status = SP_ERR_ABORTED;
    } else if (!busy.ok()) {
      status = SP_ERR_INTERNAL;
      err = "MPI has been finalized (the process is exiting)";
    } else {
      try {
        status = run(err);
      } catch (const std::exception& e) {
        status = SP_ERR_INTERNAL;
        err = e.what();
      }
    }
    if (status != SP_OK && posted && *posted != MPI_REQUEST_NULL) give_up(posted.get(), 1, nullptr);
    return status;
  }

  std::atomic<bool> given_up_{false};
  shardplan::comm::InOrderQueue<Task> queue_{
      [this](Task& task, std::string& err) { return execute(task.run, task.posted, err); }};
};

// Starts one nonblocking MPI call with `start(&request)` and completes it.
template <typename Start>
int run_one(Comm& c, const char* op, std::string& err, Start&& start, std::vector<uint8_t>* keep = nullptr) {
  MPI_Request req = MPI_REQUEST_NULL;
  int rc;
  {
    MpiLock lock;
    rc = start(&req);
  }
  if (rc != MPI_SUCCESS) {
    err = mpi_error(rc);
    return SP_ERR_INTERNAL;
  }
  return c.complete(op, &req, 1, err, nullptr, keep);
}

}  // namespace sp_mpi
