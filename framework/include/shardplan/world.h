#pragma once
// The process's place in a job: rank, world size, backend, rendezvous store,
// and the communicators for the world and for each mesh axis.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardplan/communicator.h"
#include "shardplan/mesh.h"
#include "shardplan/store.h"
#include "shardplan/threads.h"

namespace shardplan {

struct WorldOptions {
  std::string backend = "local";
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  // tcp://host:port or file:///path. Empty: tcp://MASTER_ADDR:MASTER_PORT.
  std::string store_url;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // "key=value", passed to the plugin; init_world adds local_rank=<n> (a GPU
  // backend picks its device by it).
  std::vector<std::string> backend_options;
  std::vector<std::string> plugin_dirs;
  // CPU threads of this rank, libtorch's and the BLAS pool together
  // (threads.h): > 0 as given, 0 = $SHARDPLAN_NUM_THREADS or the cores shared
  // out among the local_world_size ranks of this node, -1 = leave both as
  // they are. Ranks that are threads get a BLAS pool of one.
  int threads = 0;

  // Reads, in order of preference: torchrun variables (RANK, WORLD_SIZE,
  // LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Open MPI
  // (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE; backend mpi by default), Slurm (SLURM_PROCID,
  // SLURM_NTASKS, SLURM_LOCALID; the ranks on the node are entry SLURM_NODEID of
  // SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE, else SLURM_NTASKS_PER_NODE;
  // docs/SLURM.md), and shardplan's own
  // SHARDPLAN_BACKEND, SHARDPLAN_STORE, SHARDPLAN_TIMEOUT_MS,
  // SHARDPLAN_LOCAL_ADDR (becomes backend option local_addr=...).
  // SHARDPLAN_NUM_THREADS is read when the world is created (threads = 0).
  static WorldOptions from_env();
  // True when the environment names a multi-process job (any of the above).
  static bool env_has_job();
};

class World {
 public:
  World(const WorldOptions& options, std::shared_ptr<Store> store, std::shared_ptr<Communicator> comm,
        ThreadSettings threads = {});
  ~World();

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  const WorldOptions& options() const { return options_; }
  Communicator& comm() { return *comm_; }
  std::shared_ptr<Communicator> comm_ptr() { return comm_; }
  Store* store() { return store_.get(); }
  // What init_world set the calling thread's CPU threads to (intra_op = 0
  // when WorldOptions::threads was -1).
  const ThreadSettings& threads() const { return threads_; }

  // The group of this rank along `axis` of `mesh` (whose size must equal the
  // world size). Collective on first use for a given mesh: every rank must
  // ask for the same meshes in the same order. Cached afterwards.
  std::shared_ptr<Communicator> group(const Mesh& mesh, const std::string& axis);
  std::map<std::string, std::shared_ptr<Communicator>> groups(const Mesh& mesh);

  // Bytes and calls over the world communicator and every group.
  CommStats total_stats() const;
  void reset_stats();

  // With SHARDPLAN_COMM_TRACE=DIR (read by init_world and
  // run_ranks_in_threads) every call of this rank's communicators goes to
  // DIR/rank<N>.jsonl (framework/src/comm/comm_trace.h); this marks where
  // training step `step` begins in it. Nothing when the trace is off.
  void trace_step(int step);

 private:
  WorldOptions options_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<Communicator> comm_;
  std::map<std::string, std::shared_ptr<Communicator>> groups_;  // key: mesh.str() + "/" + axis
  ThreadSettings threads_;
};

// Loads the backend plugin, meets the other ranks through the store, and
// creates the world communicator.
std::shared_ptr<World> init_world(const WorldOptions& options);

// Runs fn(world) on n threads as ranks 0..n-1 of one world on `backend`
// ("local" by default; "gloo" works too). Each rank gets the default CPU
// threads for n ranks (threads.h; $SHARDPLAN_NUM_THREADS overrides), and the
// BLAS pool is put back as it was afterwards. When a rank throws, the world is
// aborted so the others fail instead of waiting, and the first error is
// rethrown here with its rank.
void run_ranks_in_threads(int n, const std::function<void(World&)>& fn,
                          const std::string& backend = "local",
                          std::vector<std::string> backend_options = {},
                          std::chrono::milliseconds timeout = std::chrono::minutes(5));

}  // namespace shardplan
