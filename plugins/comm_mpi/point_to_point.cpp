// send and recv: posted at issue time and only completed in issue order, so
// an exchange between two ranks does not wait behind itself.
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
namespace {

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
  auto finish = [c, req, is_send, n, dt, peer, name](std::string& err) -> int {
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
  };
  if (!is_send && !work) return c->run_now(name, finish, req);
  return c->submit(name, std::move(finish), work, req);
}

}  // namespace

int api_send(sp_comm* comm, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work) {
  return point_to_point(true, comm, buf, peer, tag, work);
}

int api_recv(sp_comm* comm, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work) {
  return point_to_point(false, comm, buf, peer, tag, work);
}

}  // namespace sp_mpi
