// Communication plugin over MPI (CPU). Torch-free: only the C ABI headers,
// comm_dtype.h and MPI's C API.
//
// Ranks are MPI's: the world communicator is a private duplicate of
// MPI_COMM_WORLD, so config->rank and world_size must agree with what mpirun
// decided, and no rendezvous store is needed.
//
// Every operation of one communicator runs on one thread at a time, in issue
// order: inline on the caller when nothing is queued, else on the
// communicator's worker thread. Running operations one after another (rather
// than only completing them in order) lets an async operation read a buffer an
// earlier one writes, as with the other backends. Each operation is an MPI
// nonblocking call completed by polling MPI_Test: MPI has no timeouts, and
// polling against a deadline and the abort flag is the only way a peer that
// never arrives yields SP_ERR_TIMEOUT instead of a hang. Point-to-point
// operations are posted at issue time and only their completion is queued, so
// an isend/irecv exchange between two ranks does not wait behind itself.
//
// Speed against blocking MPI calls (benchmarks/comm_mpi): an all_reduce of at
// most 64 KiB is our own, over point-to-point messages on a second duplicate
// communicator (OwnAllReduce), which avoids the schedule Open MPI's
// nonblocking collectives build per call; larger ones use MPI_Iallreduce with
// the algorithm prefer_fast_iallreduce() asks for.
//
// Giving up: MPI cannot cancel a collective (MPI_Cancel and MPI_Request_free
// are erroneous on one), so an operation that times out or is aborted leaves
// its request with MPI. Its buffers may still be read or written should the
// peer turn up later; the communicator therefore refuses every later call
// (SP_ERR_ABORTED), and temporaries such a request uses are never freed. At
// exit MPI_Finalize (called only if this plugin initialised MPI) is skipped
// while such a request is unfinished: finalizing with one pending is erroneous
// and can hang, and mpirun ends a job one of whose processes skipped it, which
// is what should happen to a job that lost a peer.
//
// Threads: MPI_THREAD_MULTIPLE is requested. Where MPI gives only
// MPI_THREAD_SERIALIZED, every MPI call is made under one process-wide mutex;
// less than that (an MPI the host initialised so) is refused at create,
// because worker threads call MPI.
#include <dlfcn.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "shardplan/abi/comm.h"
#include "shardplan/abi/plugin.h"
#include "shardplan/comm_dtype.h"
#include "shardplan/comm_plugin.h"

#define SP_MPI_STR2(x) #x
#define SP_MPI_STR(x) SP_MPI_STR2(x)
#if defined(OPEN_MPI) && OPEN_MPI
#define SP_MPI_BUILT_WITH \
  "Open MPI " SP_MPI_STR(OMPI_MAJOR_VERSION) "." SP_MPI_STR(OMPI_MINOR_VERSION) "." SP_MPI_STR(OMPI_RELEASE_VERSION)
#else
#define SP_MPI_BUILT_WITH "MPI " SP_MPI_STR(MPI_VERSION) "." SP_MPI_STR(MPI_SUBVERSION)
#endif

namespace sp_mpi {
class Comm;
}  // namespace sp_mpi

struct sp_comm {
  std::shared_ptr<sp_mpi::Comm> impl;
};

namespace sp_mpi {
namespace {

using Clock = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;
using shardplan::comm::dtype_size;
using shardplan::comm::dtype_traits;
using shardplan::comm::fail;
using shardplan::comm::overlaps;

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

// all_reduce up to kOwnAllReduceBytes runs OwnAllReduce rather than
// MPI_Iallreduce; above, bandwidth rules and MPI_Iallreduce keeps up.
constexpr size_t kOwnAllReduceBytes = 64 * 1024;

// Whether OwnAllReduce should halve (Rabenseifner) rather than double for a
// buffer of `bytes`. What decides below 16 KiB is how many messages need a
// rendezvous: Open MPI's shared-memory transport sends up to 4 KiB
// (header included) eagerly and costs ~3 us more per message above. Doubling
// sends the whole buffer log2(size) times, halving twice as many messages of
// half the size and less. Measured on 2 ranks with benchmarks/comm_mpi
// against MPI_Allreduce: 4 KiB doubling 3.4 us (one rendezvous) against
// 1.5 us halving (eager halves) and 1.2 us raw; 8 KiB doubling 4.4 us (one
// rendezvous) against 6.9 us halving (two) and 4.1 us raw.
bool halve_for(size_t bytes) {
  if (bytes <= 2048) return false;       // every message eager: fewest steps
  if (bytes <= 4096) return true;        // halves still eager
  if (bytes <= 16 * 1024) return false;  // all rendezvous: fewest messages
  return true;                           // bytes moved dominate
}

std::string mpi_error(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<size_t>(len));
}

// ------------------------------------------------------------ process state

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

Global& global() {
  // Never destroyed: worker threads and the exit handler may outlive statics.
  static Global* g = new Global;
  return *g;
}

// Set once before the first communicator exists, read-only afterwards.
bool g_serialize = false;
std::mutex g_call_mu;

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

void abandon(MPI_Request* reqs, int n, std::vector<uint8_t>* keep) {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  for (int i = 0; i < n; ++i)
    if (reqs[i] != MPI_REQUEST_NULL) g.abandoned.push_back(reqs[i]);
  // Moving a vector keeps its heap block where MPI was told it is.
  if (keep && !keep->empty()) g.graveyard.push_back(std::move(*keep));
}

void finalize_at_exit() {
  Global& g = global();
  {
    std::lock_guard<std::mutex> lock(g.mu);
    if (!g.we_initialised || g.finalized) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    g.finalized = true;
    // A leaked communicator's worker may still be inside an operation.
    bool pending = g.busy.load() > 0;
    for (MPI_Request& r : g.abandoned) {
      int done = 0;
      if (!pending && r != MPI_REQUEST_NULL && (MPI_Test(&r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done))
        pending = true;
    }
    if (pending) {
      g.finalized = false;
      return;
    }
    g.abandoned.clear();
  }
  MPI_Finalize();
}

template <int32_t DT, int32_t OP>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  using T = dtype_traits<DT>;
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0, n = *len; i < n; ++i) {
    const float x = T::load(a[i]), y = T::load(b[i]);
    float r;
    switch (OP) {
      case SP_SUM: r = x + y; break;
      case SP_PROD: r = x * y; break;
      case SP_MAX: r = x > y ? x : y; break;
      default: r = x < y ? x : y; break;
    }
    b[i] = T::store(r);
  }
}

template <int32_t DT>
int create_half_ops(MPI_Op* ops) {
  MPI_User_function* fns[4] = {&half_reduce<DT, SP_SUM>, &half_reduce<DT, SP_MAX>, &half_reduce<DT, SP_MIN>,
                               &half_reduce<DT, SP_PROD>};
  for (int i = 0; i < 4; ++i)
    if (int rc = MPI_Op_create(fns[i], 1, &ops[i])) return rc;
  return MPI_SUCCESS;
}

// Open MPI dlopens its components without linking them to libmpi, so they
// resolve libmpi's symbols globally; the plugin loader opened us (and with us
// libmpi) RTLD_LOCAL. Promoting libmpi to the global scope before MPI_Init
// is what mpi4py and other dlopened MPI users do.
void make_libmpi_global() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&MPI_Init_thread), &info) && info.dli_fname)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
}

// Our all_reduce above kOwnAllReduceBytes is MPI_Iallreduce (a blocking call
// could not time out or be aborted). Open MPI's blocking MPI_Allreduce picks
// its algorithm per size (coll/tuned), but its nonblocking one (coll/libnbc)
// falls back to a binomial reduce + broadcast below 4 ranks and for every
// in-place call: measured on 2 ranks, 8 MiB in place 3.65 ms against
// MPI_Allreduce's 1.60 ms. Forcing reduce-scatter + all-gather (Rabenseifner),
// which libnbc itself downgrades to a ring where it does not apply (count
// below the power of two under the group size), brings the nonblocking call
// to the blocking one at 2 and 4 ranks from 64 KiB to 8 MiB
// (docs/BENCHMARKS.md). Set before MPI_Init, where Open MPI reads its
// parameters, and never over the user's own setting; a host that initialised
// MPI itself keeps its choice.
void prefer_fast_iallreduce() {
#ifdef OMPI_MAJOR_VERSION
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", /*overwrite=*/0);
#endif
}

const char* level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
  }
}

int ensure_mpi(const std::string& who) {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.ready) return SP_OK;
  int inited = 0, fin = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (fin || g.finalized) return fail(SP_ERR_INTERNAL, who + ": MPI has already been finalized in this process");
  if (!inited) {
    make_libmpi_global();
    prefer_fast_iallreduce();
    int provided = MPI_THREAD_SINGLE;
    if (int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided))
      return fail(SP_ERR_INTERNAL, who + ": MPI_Init_thread failed: " + mpi_error(rc));
    g.we_initialised = true;
    std::atexit(&finalize_at_exit);
  }
  MPI_Query_thread(&g.thread_level);
  if (g.thread_level < MPI_THREAD_SERIALIZED)
    return fail(SP_ERR_UNSUPPORTED,
                who + ": MPI provides only " + level_name(g.thread_level) +
                    "; this backend calls MPI from its worker threads and needs MPI_THREAD_SERIALIZED or better "
                    "(initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...), or leave initialising "
                    "it to the backend)");
  g_serialize = g.thread_level < MPI_THREAD_MULTIPLE;
  int rc = create_half_ops<SP_FLOAT16>(g.half_ops[0]);
  if (rc == MPI_SUCCESS) rc = create_half_ops<SP_BFLOAT16>(g.half_ops[1]);
  if (rc != MPI_SUCCESS) return fail(SP_ERR_INTERNAL, who + ": MPI_Op_create failed: " + mpi_error(rc));
  void* ub = nullptr;
  int flag = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag) == MPI_SUCCESS && flag && ub)
    g.tag_ub = *static_cast<int*>(ub);
  MPI_Comm_rank(MPI_COMM_WORLD, &g.world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g.world_size);
  g.ready = true;
  return SP_OK;
}

MPI_Datatype mpi_type(int32_t dtype) {
  switch (dtype) {
    case SP_FLOAT32: return MPI_FLOAT;
    case SP_FLOAT64: return MPI_DOUBLE;
    // MPI has no half types; moving them needs only their size, reducing
    // them goes through our own MPI_Op.
    case SP_FLOAT16:
    case SP_BFLOAT16: return MPI_UINT16_T;
    case SP_INT8: return MPI_INT8_T;
    case SP_UINT8: return MPI_UINT8_T;
    case SP_INT32: return MPI_INT32_T;
    default: return MPI_INT64_T;
  }
}

MPI_Op mpi_op(int32_t dtype, int32_t op) {
  if (dtype == SP_FLOAT16 || dtype == SP_BFLOAT16) return global().half_ops[dtype == SP_BFLOAT16][op];
  switch (op) {
    case SP_SUM: return MPI_SUM;
    case SP_MAX: return MPI_MAX;
    case SP_MIN: return MPI_MIN;
    default: return MPI_PROD;
  }
}

uint8_t* bytes(const sp_buffer& b, size_t offset = 0) { return static_cast<uint8_t*>(b.data) + offset; }

// MPI counts are C ints.
constexpr uint64_t kMaxCount = static_cast<uint64_t>(INT_MAX);

}  // namespace

// ------------------------------------------------------------- communicator

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

namespace {

// ------------------------------------------------------------ validation

int check_buffer(const char* op, const char* which, const sp_buffer* b) {
  return shardplan::comm::check_cpu_buffer("mpi", op, which, b);
}

int check_pair(const char* op, const sp_buffer* send, const sp_buffer* recv) {
  return shardplan::comm::check_cpu_pair("mpi", op, send, recv);
}

int count_mismatch(const char* op, const std::string& what) {
  return fail(SP_ERR_INVALID, std::string("mpi ") + op + ": " + what);
}

// The count handed to MPI, which takes C ints.
int check_mpi_count(const char* op, uint64_t count) {
  if (count > kMaxCount)
    return fail(SP_ERR_UNSUPPORTED, std::string("mpi ") + op + ": " + std::to_string(count) +
                                        " elements per rank exceed MPI's int count (" + std::to_string(kMaxCount) +
                                        "); split the buffer");
  return SP_OK;
}

int check_comm(const char* op, sp_comm* comm) {
  if (!comm || !comm->impl) return fail(SP_ERR_INVALID, std::string("mpi ") + op + ": NULL communicator");
  std::string why = comm->impl->unusable();
  if (!why.empty()) return fail(SP_ERR_ABORTED, "mpi " + comm->impl->what(op) + ": " + why);
  return SP_OK;
}

int check_root(const char* op, const Comm& c, int32_t root) {
  if (root < 0 || root >= c.size)
    return fail(SP_ERR_INVALID, std::string("mpi ") + op + ": root " + std::to_string(root) +
                                    " is outside the group of " + std::to_string(c.size));
  return SP_OK;
}

int check_op(const char* op, int32_t reduce) {
  if (reduce < SP_SUM || reduce > SP_PROD)
    return fail(SP_ERR_INVALID, std::string("mpi ") + op + ": unknown reduce op " + std::to_string(reduce));
  return SP_OK;
}

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

// All-reduce in place over point-to-point messages on own_mc, for buffers
// where Open MPI's MPI_Iallreduce is slow: its nonblocking collectives build
// a schedule per call (~0.7 us against MPI_Allreduce's 0.3 us for 8 bytes on
// 2 ranks). Our requests are polled like any other, so these still time out
// and abort. Two algorithms, as MPI_Allreduce itself picks (and as MPICH
// writes them): recursive doubling, log2(size) exchanges of the whole buffer,
// for the smallest buffers; reduce-scatter by recursive halving then
// all-gather by recursive doubling (Rabenseifner), whose messages halve, up to
// kOwnAllReduceBytes. A group that is no power of two first folds its extra
// ranks into partners and hands them the result last. Every rank ends with
// the same bits: in recursive doubling both partners combine the same two
// partial results (our ops are commutative); in Rabenseifner each piece is
// reduced on one rank and copied to the others. MPI_Reduce_local serves our
// half-precision ops too.
class OwnAllReduce {
 public:
  OwnAllReduce(Comm& c, const char* op, std::string& err, char* data, int count, MPI_Datatype dt, MPI_Op mop,
               size_t elem)
      : c_(c), op_(op), err_(err), data_(data), count_(count), dt_(dt), mop_(mop), elem_(elem),
        incoming_(c.scratch) {
    if (incoming_.size() < static_cast<size_t>(count) * elem) incoming_.resize(static_cast<size_t>(count) * elem);
    while (pof2_ * 2 <= c.size) pof2_ *= 2;
    extra_ = c.size - pof2_;
    const int me = c.rank;
    // Ranks 0 .. 2*extra-1 pair up; the even one of a pair sits the doubling out.
    vrank_ = me < 2 * extra_ ? (me % 2 ? me / 2 : -1) : me - extra_;
  }

  int run(bool halving) {
    const int me = c_.rank;
    int st = SP_OK;
    if (me < 2 * extra_) {
      if (me % 2 == 0) st = exchange(me + 1, data_, count_, nullptr, 0);
      else if ((st = exchange(me - 1, nullptr, 0, in(), count_)) == SP_OK) st = reduce(0, count_);
    }
    if (st == SP_OK && vrank_ >= 0) st = halving ? halving_doubling() : doubling();
    if (st != SP_OK || me >= 2 * extra_) return st;
    return me % 2 ? exchange(me - 1, data_, count_, nullptr, 0) : exchange(me + 1, nullptr, 0, data_, count_);
  }

 private:
  int peer_of(int vpeer) const { return vpeer < extra_ ? vpeer * 2 + 1 : vpeer + extra_; }

  // Sends `scount` elements from `sbuf` to `peer` and receives `rcount` into
  // `rbuf` from it (either may be empty).
  int exchange(int peer, const char* sbuf, int scount, char* rbuf, int rcount) {
    MPI_Request q[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int rc = MPI_SUCCESS;
    {
      MpiLock lock;
      if (rbuf) rc = MPI_Irecv(rbuf, rcount, dt_, peer, 0, c_.own_mc, &q[0]);
      if (rc == MPI_SUCCESS && sbuf) rc = MPI_Isend(sbuf, scount, dt_, peer, 0, c_.own_mc, &q[1]);
    }
    if (rc != MPI_SUCCESS) {
      // A posted receive must not outlive the buffer behind it.
      if (q[0] != MPI_REQUEST_NULL) c_.give_up(q, 1, &incoming_);
      err_ = mpi_error(rc);
      return SP_ERR_INTERNAL;
    }
    return c_.complete(op_, q, 2, err_, nullptr, &incoming_);
  }

  // data[first, first + n) = incoming[first, ...) op data[first, ...).
  int reduce(int first, int n) {
    if (n == 0) return SP_OK;
    int rc;
    {
      MpiLock lock;
      rc = MPI_Reduce_local(at(in(), first), at(data_, first), n, dt_, mop_);
    }
    if (rc == MPI_SUCCESS) return SP_OK;
    err_ = "MPI_Reduce_local: " + mpi_error(rc);
    return SP_ERR_INTERNAL;
  }

  char* in() { return reinterpret_cast<char*>(incoming_.data()); }
  char* at(char* base, int element) const { return base + static_cast<size_t>(element) * elem_; }

  int doubling() {
    for (int mask = 1; mask < pof2_; mask <<= 1) {
      int st = exchange(peer_of(vrank_ ^ mask), data_, count_, in(), count_);
      if (st == SP_OK) st = reduce(0, count_);
      if (st != SP_OK) return st;
    }
    return SP_OK;
  }

  // Element offset of piece i of pof2 near-equal pieces.
  int piece(int i) const {
    const int base = count_ / pof2_, rest = count_ % pof2_;
    return i * base + std::min(i, rest);
  }

  // Pieces [lo, hi) are this rank's part of the buffer; each step of the
  // reduce-scatter halves it, keeping the half on this rank's side of its
  // partner, and the all-gather retraces the steps backwards.
  int halving_doubling() {
    int lo = 0, hi = pof2_;
    std::vector<std::pair<int, int>> kept;  // [lo, hi) before each step
    for (int mask = pof2_ / 2; mask >= 1; mask >>= 1) {
      const int vpeer = vrank_ ^ mask, mid = lo + (hi - lo) / 2;
      const bool low = vrank_ < vpeer;
      const int keep_lo = low ? lo : mid, keep_hi = low ? mid : hi;
      const int give_lo = low ? mid : lo, give_hi = low ? hi : mid;
      int st = exchange(peer_of(vpeer), at(data_, piece(give_lo)), piece(give_hi) - piece(give_lo),
                        at(in(), piece(keep_lo)), piece(keep_hi) - piece(keep_lo));
      if (st == SP_OK) st = reduce(piece(keep_lo), piece(keep_hi) - piece(keep_lo));
      if (st != SP_OK) return st;
      kept.emplace_back(lo, hi);
      lo = keep_lo;
      hi = keep_hi;
    }
    for (int mask = 1; mask < pof2_; mask <<= 1) {
      const int vpeer = vrank_ ^ mask;
      const auto [plo, phi] = kept.back();
      kept.pop_back();
      // The partner holds the other half of [plo, phi), now fully reduced.
      const int other_lo = lo == plo ? hi : plo, other_hi = lo == plo ? phi : lo;
      int st = exchange(peer_of(vpeer), at(data_, piece(lo)), piece(hi) - piece(lo), at(data_, piece(other_lo)),
                        piece(other_hi) - piece(other_lo));
      if (st != SP_OK) return st;
      lo = plo;
      hi = phi;
    }
    return SP_OK;
  }

  Comm& c_;
  const char* op_;
  std::string& err_;
  char* const data_;
  const int count_;
  const MPI_Datatype dt_;
  const MPI_Op mop_;
  const size_t elem_;
  std::vector<uint8_t>& incoming_;
  int pof2_ = 1, extra_ = 0, vrank_ = 0;
};

// ---------------------------------------------------------------- create

int api_create(const sp_comm_config* config, sp_comm** out) {
  if (int rc = shardplan::comm::check_create("mpi", config, out)) return rc;
  const int rank = config->rank, size = config->world_size;
  const ms timeout = shardplan::comm::timeout_of(*config);
  const std::string who = "mpi create (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")";
  if (int rc = ensure_mpi(who)) return rc;
  Global& g = global();
  if (g.world_rank != rank || g.world_size != size)
    return fail(SP_ERR_INVALID,
                who + ": MPI_COMM_WORLD has this process as rank " + std::to_string(g.world_rank) + " of " +
                    std::to_string(g.world_size) +
                    "; the ranks of the mpi backend are MPI's, so start the program with mpirun -np " +
                    std::to_string(size) + " (or shardplan launch --backend mpi), not as threads or under "
                    "another launcher");

  BusyScope busy;
  if (!busy.ok()) return fail(SP_ERR_INTERNAL, who + ": MPI has been finalized");
  // A duplicate keeps our traffic apart from whatever the host does on
  // MPI_COMM_WORLD; the nonblocking dup lets a rank that never comes time out.
  MPI_Comm dup[2] = {MPI_COMM_NULL, MPI_COMM_NULL};
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  int rc;
  {
    MpiLock lock;
    rc = MPI_Comm_idup(MPI_COMM_WORLD, &dup[0], &req[0]);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_idup(MPI_COMM_WORLD, &dup[1], &req[1]);
  }
  if (rc != MPI_SUCCESS) return fail(SP_ERR_INTERNAL, who + ": MPI_Comm_idup failed: " + mpi_error(rc));
  auto comm = std::make_shared<Comm>(MPI_COMM_NULL, rank, size, timeout);
  std::string err;
  rc = comm->complete("create", req, 2, err);
  if (rc != SP_OK) return fail(rc, who + ": " + err);
  {
    MpiLock lock;
    // Errors come back as codes we turn into messages, not as a job abort.
    MPI_Comm_set_errhandler(dup[0], MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(dup[1], MPI_ERRORS_RETURN);
  }
  comm->mc = dup[0];
  comm->own_mc = dup[1];
  *out = new sp_comm{comm};
  return SP_OK;
}

// ----------------------------------------------------------------- split

int api_split(sp_comm* parent, int32_t color, int32_t key, sp_comm** out) {
  if (!out) return fail(SP_ERR_INVALID, "mpi split: out is NULL");
  *out = nullptr;
  if (int rc = check_comm("split", parent)) return rc;
  Comm* p = parent->impl.get();
  std::shared_ptr<Comm> child;
  int rc = p->submit(
      "split",
      [&](std::string& err) -> int {
        // MPI_Comm_split has no nonblocking form; a barrier first makes
        // sure every rank is there, so only the barrier can time out.
        int st = run_one(*p, "split", err, [&](MPI_Request* r) { return MPI_Ibarrier(p->mc, r); });
        if (st != SP_OK) return st;
        MPI_Comm nc = MPI_COMM_NULL;
        int mrc;
        {
          MpiLock lock;
          mrc = MPI_Comm_split(p->mc, color < 0 ? MPI_UNDEFINED : color, key, &nc);
        }
        if (mrc != MPI_SUCCESS) {
          err = "MPI_Comm_split: " + mpi_error(mrc);
          return SP_ERR_INTERNAL;
        }
        if (nc == MPI_COMM_NULL) return SP_OK;
        int r = 0, n = 0;
        MPI_Comm own = MPI_COMM_NULL;
        MPI_Request q = MPI_REQUEST_NULL;
        {
          MpiLock lock;
          MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
          MPI_Comm_rank(nc, &r);
          MPI_Comm_size(nc, &n);
          mrc = MPI_Comm_idup(nc, &own, &q);
        }
        child = std::make_shared<Comm>(nc, r, n, p->timeout);
        if (mrc != MPI_SUCCESS) {
          err = "MPI_Comm_idup: " + mpi_error(mrc);
          return SP_ERR_INTERNAL;
        }
        st = child->complete("split", &q, 1, err);
        if (st != SP_OK) return st;
        {
          MpiLock lock;
          MPI_Comm_set_errhandler(own, MPI_ERRORS_RETURN);
        }
        child->own_mc = own;
        return SP_OK;
      },
      nullptr);
  if (rc != SP_OK) return rc;
  if (child) {
    p->children.adopt(child, p->aborted);
    *out = new sp_comm{child};
  }
  return SP_OK;
}

int api_abort(sp_comm* comm) {
  if (!comm || !comm->impl) return fail(SP_ERR_INVALID, "mpi abort: NULL communicator");
  // Local only: reaching the peers would take MPI_Abort, which ends the
  // whole job rather than one communicator.
  comm->impl->abort();
  return SP_OK;
}

void api_destroy(sp_comm* comm) { delete comm; }

int32_t api_rank(const sp_comm* comm) { return comm && comm->impl ? comm->impl->rank : -1; }
int32_t api_size(const sp_comm* comm) { return comm && comm->impl ? comm->impl->size : -1; }

// ----------------------------------------------------------- collectives

int api_all_reduce(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t op, sp_work** work) {
  const char* name = "all_reduce";
  if (int rc = check_comm(name, comm)) return rc;
  if (int rc = check_pair(name, send, recv)) return rc;
  if (send->count != recv->count)
    return count_mismatch(name, "send has " + std::to_string(send->count) + " elements but recv has " +
                                    std::to_string(recv->count));
  if (int rc = check_op(name, op)) return rc;
  if (int rc = check_mpi_count(name, recv->count)) return rc;
  Comm* c = comm->impl.get();
  const sp_buffer s = *send, r = *recv;
  const MPI_Datatype dt = mpi_type(r.dtype);
  const MPI_Op mop = mpi_op(r.dtype, op);
  const size_t nbytes = r.count * dtype_size(r.dtype);
  return c->submit(
      name,
      [c, s, r, dt, mop, nbytes, name](std::string& err) -> int {
        if (r.count == 0) return SP_OK;
        if (nbytes <= kOwnAllReduceBytes && c->size > 1) {
          if (s.data != r.data) std::memmove(r.data, s.data, nbytes);
          OwnAllReduce ar(*c, name, err, static_cast<char*>(r.data), static_cast<int>(r.count), dt, mop,
                          dtype_size(r.dtype));
          return ar.run(halve_for(nbytes));
        }
        const void* src = s.data;
        // MPI forbids aliased buffers; in place covers any overlap.
        if (s.data == r.data || overlaps(s.data, nbytes, r.data, nbytes)) {
          std::memmove(r.data, s.data, nbytes);
          src = MPI_IN_PLACE;
        }
        return run_one(*c, name, err, [&](MPI_Request* q) {
          return MPI_Iallreduce(src, r.data, static_cast<int>(r.count), dt, mop, c->mc, q);
        });
      },
      work);
}

int api_all_gather(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, sp_work** work) {
  const char* name = "all_gather";
  if (int rc = check_comm(name, comm)) return rc;
  if (int rc = check_pair(name, send, recv)) return rc;
  Comm* c = comm->impl.get();
  if (recv->count != send->count * c->size)
    return count_mismatch(name, "recv has " + std::to_string(recv->count) + " elements, expected send's " +
                                    std::to_string(send->count) + " x " + std::to_string(c->size) + " ranks");
  if (int rc = check_mpi_count(name, send->count)) return rc;
  const sp_buffer s = *send, r = *recv;
  const MPI_Datatype dt = mpi_type(r.dtype);
  const size_t chunk = s.count * dtype_size(s.dtype);
  return c->submit(
      name,
      [c, s, r, dt, chunk, name](std::string& err) -> int {
        if (s.count == 0) return SP_OK;
        // Our block in place serves every layout, overlapping or not, for
        // the cost of the copy MPI would make anyway.
        uint8_t* mine = bytes(r, chunk * c->rank);
        if (s.data != mine) std::memmove(mine, s.data, chunk);
        return run_one(*c, name, err, [&](MPI_Request* q) {
          return MPI_Iallgather(MPI_IN_PLACE, 0, dt, r.data, static_cast<int>(s.count), dt, c->mc, q);
        });
      },
      work);
}

int api_reduce_scatter(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t op, sp_work** work) {
  const char* name = "reduce_scatter";
  if (int rc = check_comm(name, comm)) return rc;
  if (int rc = check_pair(name, send, recv)) return rc;
  Comm* c = comm->impl.get();
  if (send->count != recv->count * c->size)
    return count_mismatch(name, "send has " + std::to_string(send->count) + " elements, expected recv's " +
                                    std::to_string(recv->count) + " x " + std::to_string(c->size) + " ranks");
  if (int rc = check_op(name, op)) return rc;
  if (int rc = check_mpi_count(name, recv->count)) return rc;
  const sp_buffer s = *send, r = *recv;
  const MPI_Datatype dt = mpi_type(r.dtype);
  const MPI_Op mop = mpi_op(r.dtype, op);
  const size_t chunk = r.count * dtype_size(r.dtype);
  return c->submit(
      name,
      [c, s, r, dt, mop, chunk, name](std::string& err) -> int {
        if (r.count == 0) return SP_OK;
        const int n = static_cast<int>(r.count);
        // MPI's in place reads the input from recv and leaves the result at
        // its start: exactly send == recv.
        if (s.data == r.data)
          return run_one(*c, name, err, [&](MPI_Request* q) {
            return MPI_Ireduce_scatter_block(MPI_IN_PLACE, r.data, n, dt, mop, c->mc, q);
          });
        if (!overlaps(r.data, chunk, s.data, chunk * c->size))
          return run_one(*c, name, err, [&](MPI_Request* q) {
            return MPI_Ireduce_scatter_block(s.data, r.data, n, dt, mop, c->mc, q);
          });
        std::vector<uint8_t> tmp(chunk);
        int st = run_one(
            *c, name, err,
            [&](MPI_Request* q) { return MPI_Ireduce_scatter_block(s.data, tmp.data(), n, dt, mop, c->mc, q); },
            &tmp);
        if (st == SP_OK) std::memcpy(r.data, tmp.data(), chunk);
        return st;
      },
      work);
}

int api_broadcast(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work) {
  const char* name = "broadcast";
  if (int rc = check_comm(name, comm)) return rc;
  Comm* c = comm->impl.get();
  if (int rc = check_root(name, *c, root)) return rc;
  const bool is_root = c->rank == root;
  if (int rc = is_root ? check_pair(name, send, recv) : check_buffer(name, "recv", recv)) return rc;
  if (is_root && send->count != recv->count)
    return count_mismatch(name, "send has " + std::to_string(send->count) + " elements but recv has " +
                                    std::to_string(recv->count));
  if (int rc = check_mpi_count(name, recv->count)) return rc;
  const sp_buffer s = is_root ? *send : *recv, r = *recv;
  const MPI_Datatype dt = mpi_type(r.dtype);
  const size_t nbytes = r.count * dtype_size(r.dtype);
  return c->submit(
      name,
      [c, s, r, dt, nbytes, root, is_root, name](std::string& err) -> int {
        if (r.count == 0) return SP_OK;
        if (is_root && s.data != r.data) std::memmove(r.data, s.data, nbytes);
        return run_one(*c, name, err, [&](MPI_Request* q) {
          return MPI_Ibcast(r.data, static_cast<int>(r.count), dt, root, c->mc, q);
        });
      },
      work);
}

int api_scatter(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work) {
  const char* name = "scatter";
  if (int rc = check_comm(name, comm)) return rc;
  Comm* c = comm->impl.get();
  if (int rc = check_root(name, *c, root)) return rc;
  const bool is_root = c->rank == root;
  if (int rc = is_root ? check_pair(name, send, recv) : check_buffer(name, "recv", recv)) return rc;
  if (is_root && send->count != recv->count * c->size)
    return count_mismatch(name, "send has " + std::to_string(send->count) + " elements, expected recv's " +
                                    std::to_string(recv->count) + " x " + std::to_string(c->size) + " ranks");
  if (int rc = check_mpi_count(name, recv->count)) return rc;
  const sp_buffer s = is_root ? *send : *recv, r = *recv;
  const MPI_Datatype dt = mpi_type(r.dtype);
  const size_t chunk = r.count * dtype_size(r.dtype);
  return c->submit(
      name,
      [c, s, r, dt, chunk, root, is_root, name](std::string& err) -> int {
        if (r.count == 0) return SP_OK;
        const int n = static_cast<int>(r.count);
        if (!is_root)
          return run_one(*c, name, err, [&](MPI_Request* q) {
            return MPI_Iscatter(nullptr, 0, dt, r.data, n, dt, root, c->mc, q);
          });
        const uint8_t* own = bytes(s, chunk * root);
        if (!overlaps(r.data, chunk, s.data, chunk * c->size))
          return run_one(*c, name, err, [&](MPI_Request* q) {
            return MPI_Iscatter(s.data, n, dt, r.data, n, dt, root, c->mc, q);
          });
        // In place leaves the root's block where it is in send; an overlapping
        // recv elsewhere gets it once the other blocks are gone.
        int st = run_one(*c, name, err, [&](MPI_Request* q) {
          return MPI_Iscatter(s.data, n, dt, MPI_IN_PLACE, n, dt, root, c->mc, q);
        });
        if (st == SP_OK && r.data != own) std::memmove(r.data, own, chunk);
        return st;
      },
      work);
}

int api_gather(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work) {
  const char* name = "gather";
  if (int rc = check_comm(name, comm)) return rc;
  Comm* c = comm->impl.get();
  if (int rc = check_root(name, *c, root)) return rc;
  const bool is_root = c->rank == root;
  if (int rc = is_root ? check_pair(name, send, recv) : check_buffer(name, "send", send)) return rc;
  if (is_root && recv->count != send->count * c->size)
    return count_mismatch(name, "recv has " + std::to_string(recv->count) + " elements, expected send's " +
                                    std::to_string(send->count) + " x " + std::to_string(c->size) + " ranks");
  if (int rc = check_mpi_count(name, send->count)) return rc;
  const sp_buffer s = *send, r = is_root ? *recv : *send;
  const MPI_Datatype dt = mpi_type(s.dtype);
  const size_t chunk = s.count * dtype_size(s.dtype);
  return c->submit(
      name,
      [c, s, r, dt, chunk, root, is_root, name](std::string& err) -> int {
        if (s.count == 0) return SP_OK;
        const int n = static_cast<int>(s.count);
        if (!is_root)
          return run_one(*c, name, err, [&](MPI_Request* q) {
            return MPI_Igather(s.data, n, dt, nullptr, 0, dt, root, c->mc, q);
          });
        // As all_gather: our block in place serves every layout.
        uint8_t* own = bytes(r, chunk * root);
        if (s.data != own) std::memmove(own, s.data, chunk);
        return run_one(*c, name, err, [&](MPI_Request* q) {
          return MPI_Igather(MPI_IN_PLACE, n, dt, r.data, n, dt, root, c->mc, q);
        });
      },
      work);
}

int api_all_to_all(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, sp_work** work) {
  const char* name = "all_to_all";
  if (int rc = check_comm(name, comm)) return rc;
  if (int rc = check_pair(name, send, recv)) return rc;
  Comm* c = comm->impl.get();
  if (send->count != recv->count || send->count % c->size != 0)
    return count_mismatch(name, "send has " + std::to_string(send->count) + " and recv " +
                                    std::to_string(recv->count) + " elements; both must be equal and divisible by " +
                                    std::to_string(c->size));
  if (int rc = check_mpi_count(name, recv->count / c->size)) return rc;
  const sp_buffer s = *send, r = *recv;
  const MPI_Datatype dt = mpi_type(r.dtype);
  const size_t total = r.count * dtype_size(r.dtype);
  return c->submit(
      name,
      [c, s, r, dt, total, name](std::string& err) -> int {
        if (r.count == 0) return SP_OK;
        const int n = static_cast<int>(r.count / c->size);
        // A private copy rather than MPI_IN_PLACE, whose support in
        // nonblocking all-to-all varies between MPI releases.
        std::vector<uint8_t> tmp;
        const void* src = s.data;
        if (overlaps(s.data, total, r.data, total)) {
          tmp.assign(bytes(s), bytes(s) + total);
          src = tmp.data();
        }
        return run_one(
            *c, name, err,
            [&](MPI_Request* q) { return MPI_Ialltoall(src, n, dt, r.data, n, dt, c->mc, q); }, &tmp);
      },
      work);
}

int point_to_point(bool is_send, sp_comm* comm, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work) {
  const char* name = is_send ? "send" : "recv";
  if (int rc = check_comm(name, comm)) return rc;
  if (int rc = check_buffer(name, "buffer", buf)) return rc;
  Comm* c = comm->impl.get();
  if (peer < 0 || peer >= c->size)
    return fail(SP_ERR_INVALID, "mpi " + c->what(name) + ": peer " + std::to_string(peer) +
                                    " is outside the group of " + std::to_string(c->size));
  const int tag_ub = global().tag_ub;
  if (tag < 0 || tag > tag_ub)
    return fail(SP_ERR_INVALID, "mpi " + c->what(name) + ": tag " + std::to_string(tag) +
                                    " is outside MPI's range 0.." + std::to_string(tag_ub));
  if (int rc = check_mpi_count(name, buf->count)) return rc;
  const MPI_Datatype dt = mpi_type(buf->dtype);
  const int n = static_cast<int>(buf->count);
  auto req = std::make_shared<MPI_Request>(MPI_REQUEST_NULL);
  {
    BusyScope busy;
    if (!busy.ok()) return fail(SP_ERR_INTERNAL, "mpi " + c->what(name) + ": MPI has been finalized");
    MpiLock lock;
    int rc = is_send ? MPI_Isend(buf->data, n, dt, peer, tag, c->mc, req.get())
                     : MPI_Irecv(buf->data, n, dt, peer, tag, c->mc, req.get());
    if (rc != MPI_SUCCESS) return fail(SP_ERR_INTERNAL, "mpi " + c->what(name) + ": " + mpi_error(rc));
  }
  return c->submit(
      name,
      [c, req, is_send, n, dt, peer, name](std::string& err) -> int {
        MPI_Status st;
        int rc = c->complete(name, req.get(), 1, err, &st);
        if (rc == SP_ERR_INVALID)
          err = "the message from rank " + std::to_string(peer) + " is longer than the " + std::to_string(n) +
                "-element recv buffer";
        if (rc != SP_OK || is_send) return rc;
        int got = 0;
        MPI_Get_count(&st, dt, &got);
        if (got != n) {
          err = "the message from rank " + std::to_string(peer) + " has " + std::to_string(got) +
                " elements but the recv buffer " + std::to_string(n);
          return SP_ERR_INVALID;
        }
        return SP_OK;
      },
      work, req);
}

int api_send(sp_comm* comm, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work) {
  return point_to_point(true, comm, buf, peer, tag, work);
}

int api_recv(sp_comm* comm, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work) {
  return point_to_point(false, comm, buf, peer, tag, work);
}

int api_barrier(sp_comm* comm, sp_work** work) {
  const char* name = "barrier";
  if (int rc = check_comm(name, comm)) return rc;
  Comm* c = comm->impl.get();
  return c->submit(
      name,
      [c, name](std::string& err) { return run_one(*c, name, err, [&](MPI_Request* q) { return MPI_Ibarrier(c->mc, q); }); },
      work);
}

// ------------------------------------------------------------------ work

// Operations give up after the communicator's timeout by themselves, but
// MPI_Comm_split (in split) blocks inside MPI; wait()'s margin bounds that.
int api_wait(sp_work* work, int64_t timeout_ms) { return shardplan::comm::wait_work("mpi", work, timeout_ms, "MPI"); }

int api_test(sp_work* work, int32_t* done) { return shardplan::comm::test_work("mpi", work, done); }

void api_release(sp_work* work) { shardplan::comm::release_work(work); }

}  // namespace
}  // namespace sp_mpi

// Not SP_CAP_THREAD_RANKS: MPI's ranks are processes.
SHARDPLAN_COMM_PLUGIN(sp_mpi, "mpi", SP_CAP_CPU | SP_CAP_PROCESS_RANKS, "shardplan mpi plugin 0.1 (" SP_MPI_BUILT_WITH ")")
