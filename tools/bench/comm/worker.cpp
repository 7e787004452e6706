#include "worker.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cuda.h"
#include "plugin.h"
#include "plugin_rank.h"
#include "protocol.h"
#include "raw_gloo.h"
#include "raw_mpi.h"
#include "roofline.h"
#include "store.h"
#include "sweep.h"

namespace shardplan_bench {

namespace {

int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names)
    if (const char* v = std::getenv(n)) return std::atoi(v);
  return fallback;
}

// The coordinator prints it (naming the series) and puts it in the report.
void report(const Options&, int rank, const std::string& what) { emit(encode_error(rank, what)); }

int gpu_for(int local_rank) {
  const Cuda* cuda = Cuda::get();
  const int n = cuda ? cuda->device_count() : 0;
  if (n < 1) throw std::runtime_error("no CUDA device");
  return local_rank % n;
}

// Ranks as threads of this process; a rank that fails aborts the others'
// communicators, so they fail too instead of waiting for it.
int run_threads(const Options& o, const sp_comm_api* api) {
  const int n = o.ranks;
  auto store = make_memory_store();
  Roofline roofline(n);
  std::mutex mu;
  std::vector<Rank*> live(n, nullptr);
  bool failed = false;
  auto rank_main = [&](int r) {
    std::unique_ptr<Rank> rank;
    try {
      if (o.w.kind == "roofline") {
        rank = make_roofline_rank(roofline, r, n, o.sweep.dtype);
      } else {
        PluginRankConfig c;
        c.api = api;
        c.rank = r;
        c.size = n;
        c.dtype = o.sweep.dtype;
        c.timeout_ms = o.sweep.timeout_ms;
        c.store = store->abi();
        c.options = {"local_id=shardplan-bench-" + std::to_string(::getpid())};
        c.options.insert(c.options.end(), o.w.plugin_options.begin(), o.w.plugin_options.end());
        if (o.w.cuda) c.cuda_device = gpu_for(r);
        rank = make_plugin_rank(c);
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        live[r] = rank.get();
        if (failed) throw std::runtime_error("another rank failed");
      }
      run_sweep(*rank, o.sweep);
    } catch (const std::exception& e) {
      report(o, r, e.what());
      std::lock_guard<std::mutex> lock(mu);
      failed = true;
      for (Rank* other : live)
        if (other) abort_plugin_rank(*other);
    }
    std::lock_guard<std::mutex> lock(mu);
    live[r] = nullptr;
    // Destroyed under the lock: nobody aborts a rank that is going away.
    rank.reset();
  };
  // A rank stuck where abort() cannot reach it (a rendezvous, a hung
  // backend) must not keep the process alive: once one rank has failed, the
  // others get a grace period, then the process exits.
  std::condition_variable finished_cv;
  int finished = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      rank_main(r);
      std::lock_guard<std::mutex> lock(mu);
      ++finished;
      finished_cv.notify_all();
    });
  {
    std::unique_lock<std::mutex> lock(mu);
    finished_cv.wait(lock, [&] { return finished == n || failed; });
    if (!finished_cv.wait_for(lock, std::chrono::seconds(10), [&] { return finished == n; })) {
      report(o, -1, std::to_string(n - finished) + " rank(s) still running 10 s after a failure; giving up on them");
      std::_Exit(1);
    }
  }
  for (auto& t : threads) t.join();
  return failed ? 1 : 0;
}

// This process is one rank, started by the coordinator or by mpirun.
int run_process(const Options& o, const sp_comm_api* api) {
  const bool mpi = o.w.launch == "mpirun";
  const int rank = mpi ? env_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}, -1) : o.w.rank;
  const int local_rank = mpi ? env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"}, rank) : rank;
  if (rank < 0 || rank >= o.ranks) {
    report(o, rank, "cannot tell this process's rank" + std::string(mpi ? " (no OMPI_COMM_WORLD_RANK)" : ""));
    return 1;
  }
  try {
    std::unique_ptr<Store> store = make_dir_store(o.w.dir + "/store");
    std::unique_ptr<Rank> r;
    if (o.w.kind == "gloo-raw") {
      r = make_raw_gloo_rank(rank, o.ranks, o.w.dir, o.sweep.dtype, std::chrono::milliseconds(o.sweep.timeout_ms));
    } else if (o.w.kind == "mpi-raw") {
      r = make_raw_mpi_rank(o.sweep.dtype);
    } else {
      PluginRankConfig c;
      c.api = api;
      c.rank = rank;
      c.size = o.ranks;
      c.dtype = o.sweep.dtype;
      c.timeout_ms = o.sweep.timeout_ms;
      c.store = store->abi();
      if (o.w.cuda) {
        c.cuda_device = gpu_for(local_rank);
        // The GPU the buffers live on; the NCCL plugin would pick the same.
        c.options = {"device=" + std::to_string(c.cuda_device)};
      }
      c.options.insert(c.options.end(), o.w.plugin_options.begin(), o.w.plugin_options.end());
      r = make_plugin_rank(c);
    }
    run_sweep(*r, o.sweep);
  } catch (const std::exception& e) {
    report(o, rank, e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int worker_main(const Options& o) {
  const sp_comm_api* api = nullptr;
  if (o.w.kind == "plugin") {
    try {
      api = open_comm_plugin(o.w.plugin);
    } catch (const std::exception& e) {
      report(o, -1, e.what());
      return 1;
    }
  }
  return o.w.launch == "threads" ? run_threads(o, api) : run_process(o, api);
}

}  // namespace shardplan_bench
