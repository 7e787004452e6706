#pragma once
// Where the example programs' ranks come from: the launcher's job (shardplan
// launch, mpirun, Slurm: this process is one rank of it) or, without one,
// ranks that are threads of this process on the in-process `local` backend.
// Torch-free.
#include <functional>

namespace shardplan {

class World;

namespace examples {

// Runs fn(world, ranks_in_process) for each rank this process holds: once,
// as the environment's rank, when it names a job (init_world(from_env())),
// else on `thread_ranks` threads (run_ranks_in_threads), which then share
// the process's memory and stdout.
void run_ranks(int thread_ranks, const std::function<void(World&, int ranks_in_process)>& fn);

// The world run_ranks(thread_ranks, ...) will make, known before any rank
// starts (to prepare what every rank needs once per process).
struct Placement {
  int world_size = 1;
  bool holds_rank0 = true;  // always, for thread ranks
};
Placement placement_of(int thread_ranks);

}  // namespace examples
}  // namespace shardplan
