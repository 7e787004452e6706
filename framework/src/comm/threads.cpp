#include "shardplan/threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "base/env.h"
#include "shardplan/error.h"

namespace shardplan {
namespace {

// Looked up at run time rather than linked: libtorch reaches OpenBLAS through
// the libblas.so.3 alternative, which may as well be another BLAS (then these
// are absent and only libtorch's pool is set).
using GetThreads = int (*)();
using SetThreads = void (*)(int);

GetThreads blas_getter() {
  static const auto fn = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return fn;
}

SetThreads blas_setter() {
  static const auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  return fn;
}

int threads_from_env() {
  return static_cast<int>(env::integer("SHARDPLAN_NUM_THREADS", 1, 4096, "a number of threads", 0));
}

// OpenMP's own variable, as libtorch reads it: the first number of a list
// ("4,2"); anything else is OpenMP's business and ignored here.
int threads_from_omp_env() {
  const char* v = std::getenv("OMP_NUM_THREADS");
  if (!v || !*v) return 0;
  const long n = std::strtol(v, nullptr, 10);
  return n >= 1 && n <= 4096 ? static_cast<int>(n) : 0;
}

// What Slurm gave each task (srun/sbatch -c N): a rank that is a task gets
// all of it, ranks that are threads of one task share it. Set only with -c;
// without it Slurm's tasks get one CPU each, which the default's cores per
// rank on the node already says.
int threads_from_slurm(int ranks_in_process) {
  const int cpus = static_cast<int>(env::integer("SLURM_CPUS_PER_TASK", 1, 4096, "a number of CPUs", 0));
  return cpus == 0 ? 0 : std::max(1, cpus / std::max(1, ranks_in_process));
}

}  // namespace

std::string ThreadSettings::str() const {
  std::string s = std::to_string(threads > 0 ? threads : intra_op) + " per rank (intra-op " + std::to_string(intra_op) + ", BLAS " +
                  (blas > 0 ? std::to_string(blas) : std::string("not OpenBLAS")) + "; " + std::to_string(ranks) +
                  (ranks == 1 ? " rank" : " ranks") + " on " + std::to_string(cores) +
                  (cores == 1 ? " core" : " cores");
  return s + (source.empty() ? "" : ", " + source) + ")";
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

int default_num_threads(int ranks_on_node) {
  return std::max(1, available_cores() / std::max(1, ranks_on_node));
}

int blas_num_threads() {
  GetThreads get = blas_getter();
  return get ? get() : 0;
}

bool set_blas_num_threads(int n) {
  SetThreads set = blas_setter();
  if (!set) return false;
  set(n);
  return true;
}

namespace {

// How one rank spends its `threads`. A rank that is a process of its own
// gives them all to OpenBLAS and keeps libtorch's OpenMP pool at one:
// OpenMP's workers spin between parallel regions on the cores OpenBLAS's
// threads need, and each OpenMP worker calling BLAS multiplies the two, so
// 2 x 2 threads on 2 cores trained the GPT example at 0.52x the speed of
// 1 x 1, and 1 x N was the best split in every case of
// benchmarks/threads/compare_threads.sh (docs/THREADS.md). Ranks that are
// threads of one process keep a BLAS pool of one (OpenBLAS serialises
// concurrent multi-threaded calls on one lock) and their threads go to
// libtorch; so does everything when the BLAS is not OpenBLAS (no pool to give
// them to). An exported OPENBLAS_NUM_THREADS keeps the pool as it is.
void apply_split(int threads, int ranks_in_process, bool blas_from_env) {
  const bool blas_takes_them = ranks_in_process <= 1 && blas_setter() != nullptr;
  at::set_num_threads(blas_takes_them ? 1 : threads);
  if (!blas_from_env) set_blas_num_threads(ranks_in_process > 1 ? 1 : threads);
}

}  // namespace

ThreadSettings current_threads(int ranks_on_node) {
  ThreadSettings s;
  s.intra_op = at::get_num_threads();
  s.blas = blas_num_threads();
  s.cores = available_cores();
  s.ranks = std::max(1, ranks_on_node);
  return s;
}

ThreadSettings set_num_threads(int threads, int ranks_on_node, int ranks_in_process) {
  if (threads < 0) throw Error("number of threads must be positive (0: the default), got " + std::to_string(threads));
  std::string source = "argument";
  // A variable the user exported for the BLAS pool alone is kept unless the
  // caller names a number explicitly.
  const bool blas_from_env = threads == 0 && std::getenv("OPENBLAS_NUM_THREADS");
  if (threads == 0) {
    threads = threads_from_env();
    source = "SHARDPLAN_NUM_THREADS";
  }
  if (threads == 0) {
    threads = threads_from_omp_env();
    source = "OMP_NUM_THREADS";
  }
  if (threads == 0) {
    threads = threads_from_slurm(ranks_in_process);
    source = "SLURM_CPUS_PER_TASK";
  }
  if (threads == 0) {
    threads = default_num_threads(ranks_on_node);
    source = "default";
  }
  apply_split(threads, ranks_in_process, blas_from_env);
  ThreadSettings s = current_threads(ranks_on_node);
  s.threads = threads;
  s.source = source;
  // More ranks than cores is the user's choice of ranks; fewer threads cannot help it.
  if (threads > 1 && static_cast<long>(s.ranks) * threads > s.cores) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      std::fprintf(stderr,
                   "shardplan: warning: %d rank(s) x %d thread(s) exceed the %d core(s) this process may use; "
                   "the ranks will slow each other down (set --threads or SHARDPLAN_NUM_THREADS to at most %d)\n",
                   s.ranks, threads, s.cores, std::max(1, s.cores / s.ranks));
  }
  return s;
}

}  // namespace shardplan
