#pragma once
// One setting for the CPU threads a rank computes with. libtorch's intra-op
// pool (OpenMP, at::set_num_threads) and the BLAS library's own pool are two
// knobs: at::set_num_threads never reaches OpenBLAS, whose pthread pool keeps
// the size it read from the environment at load time, so a rank that asked
// for one thread still ran every matrix product on all cores and several
// ranks on one machine oversubscribed it (3x slower on 2 cores). This sets
// both, with a default that keeps ranks x threads within the cores the
// process may use.
#include <string>

namespace shardplan {

struct ThreadSettings {
  int threads = 0;   // per rank, as asked for (0: not set by set_num_threads)
  int intra_op = 0;  // libtorch intra-op threads of the calling thread
  int blas = 0;      // OpenBLAS's pool (process-wide); 0 when the BLAS is not OpenBLAS
  int cores = 0;     // cores this process may run on (its CPU affinity)
  int ranks = 1;     // ranks sharing those cores
  std::string source;  // "argument", "SHARDPLAN_NUM_THREADS", "OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK" or "default"
  std::string str() const;  // "1 per rank (intra-op 1, BLAS 1; 2 ranks on 2 cores, default)"
};

// Cores the calling process may run on (sched_getaffinity; a cgroup's CPU
// quota is not seen, as with torch's own default).
int available_cores();

// max(1, available_cores() / ranks_on_node).
int default_num_threads(int ranks_on_node);

// Gives a rank `threads` CPU threads, split between libtorch's intra-op pool
// (of the calling thread) and OpenBLAS's pool: a rank that is a process of
// its own gets intra-op 1 and a BLAS pool of `threads` (the fastest split,
// docs/THREADS.md); ranks that are threads of one process get intra-op
// `threads` and a BLAS pool of one. `threads` > 0 is taken as given; 0 means, in order,
// $SHARDPLAN_NUM_THREADS, $OMP_NUM_THREADS (what torch users already set,
// and what torchrun sets), $SLURM_CPUS_PER_TASK / ranks_in_process (srun -c),
// else default_num_threads(ranks_on_node); with 0, an
// exported $OPENBLAS_NUM_THREADS keeps the BLAS pool at its size.
// ranks_in_process > 1 (ranks as threads of this process) keeps the BLAS pool
// at one thread: OpenBLAS serialises concurrent multi-threaded level-3 calls
// on one lock, so ranks sharing a pool would wait for each other, while with a
// pool of one each rank's products run on its own thread. Without OpenBLAS
// every thread goes to libtorch. When ranks x threads
// exceed the cores with more than one thread per rank, prints one warning to
// stderr per process. Throws Error for
// threads < 0 or an unparsable SHARDPLAN_NUM_THREADS.
ThreadSettings set_num_threads(int threads = 0, int ranks_on_node = 1, int ranks_in_process = 1);

// The current settings of the calling thread, without changing them.
ThreadSettings current_threads(int ranks_on_node = 1);

// OpenBLAS's pool size, or 0 when the process's BLAS is not OpenBLAS; and a
// setter that does nothing then (returns false).
int blas_num_threads();
bool set_blas_num_threads(int n);

}  // namespace shardplan
