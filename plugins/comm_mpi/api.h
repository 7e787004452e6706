#pragma once
// The ABI's calls made in files of their own, for the entry point's table in
// comm_mpi.cpp.
#include <cstdint>

#include "shardplan/abi/comm.h"

namespace sp_mpi {

// split.cpp
int api_split(sp_comm* parent, int32_t color, int32_t key, sp_comm** out);

// all_reduce.cpp
int api_all_reduce(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t op, sp_work** work);

// collectives.cpp
int api_all_gather(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, sp_work** work);
int api_reduce_scatter(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t op, sp_work** work);
int api_broadcast(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work);
int api_scatter(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work);
int api_gather(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work);
int api_all_to_all(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, sp_work** work);
int api_barrier(sp_comm* comm, sp_work** work);

// point_to_point.cpp
int api_send(sp_comm* comm, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work);
int api_recv(sp_comm* comm, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work);

}  // namespace sp_mpi
