// bench_comm_mpi: the mpi plugin's all_reduce, driven through the C ABI,
// against MPI_Allreduce called directly, in the same processes, on identical
// buffers (float32, sum, in place). Start it like any MPI program:
//
//   mpirun -np 2 bench_comm_mpi [--scale S] [--min-bytes B] [--max-bytes B] [--plugin PATH] [--control]
//   shardplan launch --backend mpi -n 2 -- bench_comm_mpi ...
//
// Blocks of calls through the plugin and through MPI_Allreduce alternate
// (tools/bench/comm/interleaved.h); the table gives the median time per call
// of each side and the median over neighbouring pairs of blocks of the ratio
// raw/plugin: plugin throughput as a fraction of raw MPI's (1.00 = no
// overhead). --control measures MPI_Allreduce against itself (on a duplicate
// of MPI_COMM_WORLD) instead of the plugin: its ratio column is the noise
// floor. The plugin initialises MPI (raw MPI then runs inside the same
// MPI_Init), so the run sees the plugin's own Open MPI parameter choices;
// `-x OMPI_MCA_<name>=<value>` on mpirun overrides them as for any program.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "interleaved.h"
#include "plugin.h"
#include "shardplan/abi/comm.h"

namespace {

constexpr int64_t kTimeoutMs = 120000;

// MPI_Allreduce on `comm`, MPI_IN_PLACE, as an MPI program writes it.
class Raw final : public shardplan_bench::ReduceSide {
 public:
  explicit Raw(MPI_Comm comm) : comm_(comm) {}
  void all_reduce(float* data, size_t n) override {
    if (MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm_) != MPI_SUCCESS)
      throw std::runtime_error("MPI_Allreduce failed");
  }
  void barrier() override { MPI_Barrier(comm_); }

 private:
  MPI_Comm comm_;
};

int env_int(const char* a, const char* b, int fallback) {
  const char* v = std::getenv(a);
  if (!v) v = std::getenv(b);
  return v ? std::atoi(v) : fallback;
}

int usage() {
  std::fprintf(stderr,
               "usage: mpirun -np N bench_comm_mpi [--scale S] [--min-bytes B] [--max-bytes B] [--plugin PATH] "
               "[--control]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  shardplan_bench::InterleavedArgs args;
  args.plugin = SHARDPLAN_MPI_PLUGIN;
  std::string why;
  if (!shardplan_bench::parse_interleaved_args(argc, argv, args, nullptr, &why)) {
    if (!why.empty()) std::fprintf(stderr, "bench_comm_mpi: %s\n", why.c_str());
    return usage();
  }
  shardplan_bench::InterleavedOptions& o = args.options;
  const bool control = args.control;

  // The plugin checks its rank and size against MPI_COMM_WORLD's.
  o.rank = env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", -1);
  o.size = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", -1);
  if (o.rank < 0 || o.size < 1) {
    std::fprintf(stderr, "bench_comm_mpi: not started by mpirun (no OMPI_COMM_WORLD_RANK); "
                         "run: mpirun -np 2 bench_comm_mpi\n");
    return 2;
  }
  try {
    const sp_comm_api* api = shardplan_bench::open_comm_plugin(args.plugin);
    // Created first: the plugin initialises MPI the way it does for users.
    shardplan_bench::PluginReduceSide plugin(api, o.rank, o.size, kTimeoutMs, {});
    MPI_Comm world_dup = MPI_COMM_NULL, dup_for_control = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &world_dup);
    Raw raw(world_dup);
    std::unique_ptr<Raw> second;
    if (control) {
      MPI_Comm_dup(MPI_COMM_WORLD, &dup_for_control);
      second = std::make_unique<Raw>(dup_for_control);
    }
    o.tested_name = control ? "control" : "plugin";
    o.raw_name = "raw MPI";
    o.title = "all_reduce float32 sum in place, " + std::to_string(o.size) + " ranks (mpirun)" +
              (control ? "; CONTROL: MPI_Allreduce against itself" : "; plugin: MPI_Iallreduce polled");
    if (control) shardplan_bench::run_interleaved(*second, raw, o);
    else shardplan_bench::run_interleaved(plugin, raw, o);
    MPI_Comm_free(&world_dup);
    if (dup_for_control != MPI_COMM_NULL) MPI_Comm_free(&dup_for_control);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_comm_mpi: rank %d: %s\n", o.rank, e.what());
    std::fflush(stderr);
    // A peer may wait in a collective for us; MPI_Abort ends the whole job.
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 0;
}
