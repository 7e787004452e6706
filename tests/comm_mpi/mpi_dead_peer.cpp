// mpi_dead_peer: a peer that stops taking part must cost the others an error
// within the communicator's timeout, never a hang.
//
//   mpirun -np N mpi_dead_peer PLUGIN.so     (N >= 2)
//
// Every rank but 0 becomes the stuck peer (it sleeps far longer than the test
// may take). Rank 0 checks, on the raw C ABI of the plugin it is given:
//  - a blocking all_reduce nobody joins fails with SP_ERR_TIMEOUT after about
//    the communicator's timeout, and the communicator then refuses more work;
//  - wait() with its own short timeout says SP_ERR_TIMEOUT and keeps the work
//    valid; abort() then ends the same work with SP_ERR_ABORTED at once, and
//    later calls fail the same way.
// It prints "mpi_dead_peer: rank 0: PASS" and exits. The abandoned requests
// keep the plugin from finalizing MPI, so mpirun ends the job (the stuck
// ranks too) with a non-zero status: the test looks for the PASS line and
// for the job to be over in time, not at the exit status.
//
// Torch-free: it loads the plugin with dlopen, as the framework would.
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "shardplan/abi/comm.h"
#include "shardplan/abi/plugin.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kTimeoutMs = 3000;

int g_failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("mpi_dead_peer: rank 0: %s: %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}

long long ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc != 2) {
    std::fprintf(stderr, "usage: mpirun -np N %s PLUGIN.so\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "mpi_dead_peer: %s\n", dlerror());
    return 2;
  }
  auto entry = reinterpret_cast<sp_plugin_entry_fn>(dlsym(lib, SP_PLUGIN_ENTRY_SYMBOL));
  const sp_comm_api* api = entry ? static_cast<const sp_comm_api*>(entry()->factory()) : nullptr;
  const int rank = env_int("OMPI_COMM_WORLD_RANK"), size = env_int("OMPI_COMM_WORLD_SIZE");
  if (!api || rank < 0 || size < 2) {
    std::fprintf(stderr, "mpi_dead_peer: needs the mpi plugin and at least 2 ranks started by mpirun\n");
    return 2;
  }

  sp_comm_config cfg{};
  cfg.struct_size = sizeof cfg;
  cfg.rank = rank;
  cfg.world_size = size;
  cfg.timeout_ms = kTimeoutMs;
  sp_comm* world = nullptr;
  if (api->create(&cfg, &world) != SP_OK) {
    std::fprintf(stderr, "mpi_dead_peer: rank %d: create: %s\n", rank, api->last_error());
    return 1;
  }
  sp_comm* sub = nullptr;
  if (api->split(world, 0, rank, &sub) != SP_OK || !sub || api->barrier(world, nullptr) != SP_OK) {
    std::fprintf(stderr, "mpi_dead_peer: rank %d: split/barrier: %s\n", rank, api->last_error());
    return 1;
  }

  if (rank != 0) {
    sleep(100);  // longer than ctest lets the test run: only a hang gets here
    return 0;
  }

  float data[7] = {1, 2, 3, 4, 5, 6, 7};
  sp_buffer b{};
  b.data = data;
  b.count = 7;
  b.dtype = SP_FLOAT32;
  b.device_type = SP_DEVICE_CPU;

  auto t0 = Clock::now();
  int st = api->all_reduce(world, &b, &b, SP_SUM, nullptr);
  long long took = ms_since(t0);
  std::string msg = api->last_error();
  check(st == SP_ERR_TIMEOUT, "all_reduce nobody joins returns SP_ERR_TIMEOUT (status " + std::to_string(st) +
                                  ": " + msg + ")");
  check(took >= kTimeoutMs - 100 && took < kTimeoutMs + 10000,
        "after about the timeout (" + std::to_string(took) + " ms)");
  check(msg.find("all_reduce") != std::string::npos, "the message names the collective");

  t0 = Clock::now();
  st = api->barrier(world, nullptr);
  msg = api->last_error();
  check(st == SP_ERR_ABORTED && ms_since(t0) < 1000,
        "the next call fails at once with SP_ERR_ABORTED (status " + std::to_string(st) + ": " + msg + ")");
  check(msg.find("timed out") != std::string::npos, "and says an earlier operation timed out");

  sp_work* w = nullptr;
  st = api->all_reduce(sub, &b, &b, SP_MAX, &w);
  check(st == SP_OK && w, "async all_reduce on a second communicator is issued");
  if (w) {
    st = api->wait(w, 200);
    check(st == SP_ERR_TIMEOUT, "wait(200 ms) returns SP_ERR_TIMEOUT (status " + std::to_string(st) + ")");
    int32_t done = 1;
    st = api->test(w, &done);
    check(st == SP_OK && !done, "the work stays valid and unfinished");
    t0 = Clock::now();
    check(api->abort(sub) == SP_OK, "abort() succeeds");
    st = api->wait(w, -1);
    took = ms_since(t0);
    check(st == SP_ERR_ABORTED && took < 2000,
          "abort ends the pending work with SP_ERR_ABORTED (status " + std::to_string(st) + " after " +
              std::to_string(took) + " ms: " + api->last_error() + ")");
    api->release(w);
  }
  st = api->all_gather(sub, &b, &b, nullptr);
  check(st == SP_ERR_ABORTED, "later calls on the aborted communicator fail with SP_ERR_ABORTED (status " +
                                  std::to_string(st) + ")");

  api->destroy(sub);
  api->destroy(world);
  if (g_failures) {
    std::printf("mpi_dead_peer: rank 0: %d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("mpi_dead_peer: rank 0: PASS\n");
  return 0;
}
