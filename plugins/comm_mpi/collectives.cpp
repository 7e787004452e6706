// The collectives other than all_reduce: each one MPI nonblocking call,
// with our own copies where MPI's in-place rules do not fit the caller's
// buffers.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "api.h"
#include "comm.h"
#include "mpi_support.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_plugin.h"
#include "validation.h"

namespace sp_mpi {

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

int api_barrier(sp_comm* comm, sp_work** work) {
  const char* name = "barrier";
  if (int rc = check_comm(name, comm)) return rc;
  Comm* c = comm->impl.get();
  return c->submit(
      name,
      [c, name](std::string& err) { return run_one(*c, name, err, [&](MPI_Request* q) { return MPI_Ibarrier(c->mc, q); }); },
      work);
}

}  // namespace sp_mpi
