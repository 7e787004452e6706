// split: a collective over a communicator that makes its children, each with
// its own two duplicates, adopted so that aborting the parent reaches them.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

#include "api.h"
#include "comm.h"
#include "mpi_support.h"
#include "process.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_plugin.h"
#include "validation.h"

namespace sp_mpi {

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

}  // namespace sp_mpi
