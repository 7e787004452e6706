// Initialising MPI (or taking the host's), and finalizing it at exit only
// when we initialised it and nothing can still be using it.
#include "process.h"

#include <dlfcn.h>
#include <mpi.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "mpi_support.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_dtype.h"
#include "shardplan/comm_plugin.h"

namespace sp_mpi {

void abandon(MPI_Request* reqs, int n, std::vector<uint8_t>* keep) {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  for (int i = 0; i < n; ++i)
    if (reqs[i] != MPI_REQUEST_NULL) g.abandoned.push_back(reqs[i]);
  // Moving a vector keeps its heap block where MPI was told it is.
  if (keep && !keep->empty()) g.graveyard.push_back(std::move(*keep));
}

namespace {

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

}  // namespace

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

}  // namespace sp_mpi
