// mpi_host_init: the host program, not the plugin, initialises MPI.
//
//   mpirun -np N mpi_host_init serialized PLUGIN.so   the conformance suite must
//       pass with every MPI call of the plugin made under its process-wide lock
//   mpirun -np N mpi_host_init funneled PLUGIN.so     create must refuse, clearly
//
// The host keeps MPI_COMM_WORLD for itself (a barrier of its own runs between
// the plugin's operations) and finalizes MPI itself: the plugin must neither
// finalize nor disturb it. Prints "mpi_host_init: PASS" on success.
#include <dlfcn.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "conformance.h"
#include "shardplan/abi/comm.h"
#include "shardplan/abi/plugin.h"

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc != 3 || (std::strcmp(argv[1], "serialized") != 0 && std::strcmp(argv[1], "funneled") != 0)) {
    std::fprintf(stderr, "usage: mpirun -np N %s serialized|funneled PLUGIN.so\n", argv[0]);
    return 2;
  }
  const bool serialized = std::strcmp(argv[1], "serialized") == 0;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, serialized ? MPI_THREAD_SERIALIZED : MPI_THREAD_FUNNELED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  void* lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  auto entry = lib ? reinterpret_cast<sp_plugin_entry_fn>(dlsym(lib, SP_PLUGIN_ENTRY_SYMBOL)) : nullptr;
  if (!entry) {
    std::fprintf(stderr, "mpi_host_init: cannot load %s: %s\n", argv[2], dlerror());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const sp_comm_api* api = static_cast<const sp_comm_api*>(entry()->factory());

  sp_comm_config cfg{};
  cfg.struct_size = sizeof cfg;
  cfg.rank = rank;
  cfg.world_size = size;
  cfg.timeout_ms = 120000;
  sp_comm* comm = nullptr;
  const int st = api->create(&cfg, &comm);
  int failed = 0;
  if (!serialized) {
    // MPI may grant more than was asked; the plugin is right to accept that.
    const bool refused = st == SP_ERR_UNSUPPORTED && std::strstr(api->last_error(), "MPI_THREAD_FUNNELED");
    if (provided >= MPI_THREAD_SERIALIZED ? st != SP_OK : !refused) {
      std::printf("mpi_host_init: rank %d: FAIL: create with %s gave status %d (%s)\n", rank,
                  provided >= MPI_THREAD_SERIALIZED ? "a serialized MPI" : "a funneled MPI", st, api->last_error());
      failed = 1;
    } else if (rank == 0) {
      std::printf("mpi_host_init: create said: %s\n", api->last_error());
    }
    if (comm) api->destroy(comm);
  } else if (st != SP_OK) {
    std::printf("mpi_host_init: rank %d: FAIL: create: %s\n", rank, api->last_error());
    failed = 1;
  } else {
    auto r = shardplan::conformance::run_conformance(api, comm);
    for (const auto& f : r.failures) std::printf("mpi_host_init: FAIL %s\n", f.c_str());
    std::printf("mpi_host_init: rank %d: %d passed, %d failed\n", rank, r.passed, r.failed);
    failed = r.ok() ? 0 : 1;
    MPI_Barrier(MPI_COMM_WORLD);  // the host's own traffic is untouched
    api->destroy(comm);
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!any && rank == 0) std::printf("mpi_host_init: PASS\n");
  MPI_Finalize();
  return any;
}
