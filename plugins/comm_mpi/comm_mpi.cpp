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
//
// The pieces: process.h (MPI's initialisation, threading level and
// finalization; the process-wide lock), mpi_support.h (errors, datatypes and
// reduce ops in MPI's terms), comm.h (a communicator, its queue and the
// polling of its requests), validation.h (argument checks), all_reduce.cpp
// (OwnAllReduce and the choice of algorithm), collectives.cpp,
// point_to_point.cpp and split.cpp (their calls declared in api.h); here
// create, abort, the calls on work and the entry point.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

#include "api.h"
#include "comm.h"
#include "mpi_support.h"
#include "process.h"
#include "shardplan/abi/comm.h"
#include "shardplan/abi/plugin.h"
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
namespace {

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
