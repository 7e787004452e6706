#pragma once
// MPI_Allreduce called directly on MPI_COMM_WORLD, in a process started by
// mpirun: the reference for the MPI plugin. Only built when CMake finds MPI
// (SHARDPLAN_BENCH_HAVE_MPI).
#include <memory>

#include "rank.h"

namespace shardplan_bench {

// Initialises MPI (finalised when the rank is destroyed); throws when this
// build has no MPI.
std::unique_ptr<Rank> make_raw_mpi_rank(int32_t dtype);
bool have_raw_mpi();

}  // namespace shardplan_bench
