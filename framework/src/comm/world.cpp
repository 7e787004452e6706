#include "shardplan/world.h"

#include <c10/util/Exception.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "base/env.h"
#include "comm/comm_trace.h"
#include "shardplan/error.h"
#include "shardplan/plugin_loader.h"

namespace shardplan {

namespace {

using env::get;
constexpr long long kMaxRanks = 1 << 24;

// A rank or a count: every launcher writes plain numbers, so "3x" is a typo.
int env_int(const char* name, int fallback) {
  return static_cast<int>(env::integer(name, 0, kMaxRanks, "a rank or a count", fallback));
}

// Slurm writes counts per node like "2(x3)": the leading integer is the count.
int slurm_count(const char* name, int fallback) {
  const char* v = get(name);
  if (!v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || x < 0 || x > kMaxRanks || (*end && *end != '('))
    throw Error(std::string(name) + "='" + v + "' is not a count (a whole number, or Slurm's N(xM))");
  return static_cast<int>(x);
}

// Entry `node` of a per-node list as Slurm writes SLURM_TASKS_PER_NODE:
// "2(x3),1" is 2, 2, 2, 1. The whole list is checked, whichever entry is
// ours; counts and repeats are bounded by kMaxRanks.
int slurm_count_of_node(const char* name, long long node) {
  const std::string v = get(name);
  auto bad = [&] {
    return Error(std::string(name) + "='" + v + "' is not a list of counts per node (Slurm's N or N(xM), comma separated)");
  };
  auto number = [&](const char*& p) {
    if (!std::isdigit(static_cast<unsigned char>(*p))) throw bad();
    char* end = nullptr;
    const long x = std::strtol(p, &end, 10);
    if (x > kMaxRanks) throw bad();
    p = end;
    return x;
  };
  long long first = 0;  // index of the node the current item starts at
  int ours = -1;
  for (const char* p = v.c_str();; ++p) {
    const long count = number(p);
    long repeat = 1;
    if (*p == '(') {
      if (p[1] != 'x') throw bad();
      p += 2;
      repeat = number(p);
      if (*p++ != ')' || repeat < 1) throw bad();
    }
    if (ours < 0 && node < first + repeat) ours = static_cast<int>(count);
    first += repeat;
    if (!*p) break;
    if (*p != ',') throw bad();
  }
  if (ours < 0)
    throw Error("SLURM_NODEID=" + std::to_string(node) + " is beyond the " + std::to_string(first) + " node(s) of " +
                name + "='" + v + "'");
  return ours;
}

// Ranks on this node as Slurm started them: the step's layout (srun sets
// SLURM_STEP_TASKS_PER_NODE, and SLURM_TASKS_PER_NODE, for every task),
// entry SLURM_NODEID. SLURM_NTASKS_PER_NODE exists only with
// --ntasks-per-node, so it is the last resort.
int slurm_tasks_on_node() {
  const long long node = env::integer("SLURM_NODEID", 0, kMaxRanks, "a node index", 0);
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})
    if (get(name)) return slurm_count_of_node(name, node);
  return slurm_count("SLURM_NTASKS_PER_NODE", 1);
}

// sbatch's batch script has SLURM_PROCID=0 and the job's SLURM_NTASKS too,
// but it is one process: run there, rank 0 would wait the whole rendezvous
// timeout for ranks nobody starts. srun's tasks have a step id.
void check_slurm_step(int world_size) {
  if (world_size <= 1 || get("SLURM_STEP_ID") || get("SLURM_STEPID")) return;
  const char* job = get("SLURM_JOB_ID");
  throw Error("SLURM_NTASKS=" + std::to_string(world_size) + ", but this process is not a task of an srun step" +
              (job ? std::string(" (it is job ") + job + "'s batch script)" : std::string()) +
              ": start the ranks with srun (docs/SLURM.md)");
}

// Open MPI finds its peers through PMIx; a task that srun started without
// it (no --mpi=pmix, and MpiDefault=none) would fail inside MPI_Init with
// Open MPI's own "OPAL ERROR", which says nothing of the cause.
void check_mpi_under_srun() {
  if (!get("SLURM_STEP_ID") && !get("SLURM_STEPID")) return;
  if (get("OMPI_COMM_WORLD_RANK") || get("PMIX_RANK") || get("PMI_RANK")) return;
  throw Error(
      "backend 'mpi' under srun needs Slurm's PMIx: run srun --mpi=pmix (this task has SLURM_PROCID but no "
      "PMIX_RANK, so Open MPI cannot find its peers), or use backend gloo with MASTER_ADDR and MASTER_PORT "
      "(docs/SLURM.md)");
}

}  // namespace

bool WorldOptions::env_has_job() {
  return get("RANK") || get("OMPI_COMM_WORLD_RANK") || get("PMI_RANK") || get("SLURM_PROCID");
}

WorldOptions WorldOptions::from_env() {
  WorldOptions o;
  if (get("RANK")) {
    o.rank = env_int("RANK", 0);
    o.world_size = env_int("WORLD_SIZE", 1);
    o.local_rank = env_int("LOCAL_RANK", o.rank);
    o.local_world_size = env_int("LOCAL_WORLD_SIZE", o.world_size);
  } else if (get("OMPI_COMM_WORLD_RANK")) {
    o.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    o.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    o.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", o.rank);
    o.local_world_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", o.world_size);
  } else if (get("SLURM_PROCID")) {
    o.rank = env_int("SLURM_PROCID", 0);
    o.world_size = env_int("SLURM_NTASKS", 1);
    o.local_rank = env_int("SLURM_LOCALID", 0);
    o.local_world_size = slurm_tasks_on_node();
    check_slurm_step(o.world_size);
  }
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    throw Error("environment gives rank " + std::to_string(o.rank) + " of world size " +
                std::to_string(o.world_size));

  // Without a choice, the backend follows who started the job: mpirun's
  // ranks can always talk MPI, anyone else's TCP.
  if (const char* b = get("SHARDPLAN_BACKEND")) o.backend = b;
  else if (!get("RANK") && get("OMPI_COMM_WORLD_RANK")) o.backend = "mpi";
  else o.backend = env_has_job() ? "gloo" : "local";
  if (o.backend == "mpi") check_mpi_under_srun();

  if (const char* s = get("SHARDPLAN_STORE")) {
    o.store_url = s;
  } else if (get("MASTER_ADDR")) {
    o.store_url = std::string("tcp://") + get("MASTER_ADDR") + ":" +
                  std::to_string(env::integer("MASTER_PORT", 1, 65535, "a TCP port", 29500));
  }
  // The same range as `shardplan launch --timeout-ms`.
  if (get("SHARDPLAN_TIMEOUT_MS"))
    o.timeout = std::chrono::milliseconds(
        env::integer("SHARDPLAN_TIMEOUT_MS", 1, 1000000000000LL, "a timeout in milliseconds", 0));
  if (const char* a = get("SHARDPLAN_LOCAL_ADDR")) o.backend_options.push_back(std::string("local_addr=") + a);
  return o;
}

// ---------------------------------------------------------------- World

World::World(const WorldOptions& options, std::shared_ptr<Store> store, std::shared_ptr<Communicator> comm,
             ThreadSettings threads)
    : options_(options), store_(std::move(store)), comm_(std::move(comm)), threads_(std::move(threads)) {}

World::~World() {
  // Groups first: a backend may tie a sub-communicator to its parent.
  groups_.clear();
  comm_.reset();
}

std::shared_ptr<Communicator> World::group(const Mesh& mesh, const std::string& axis) {
  std::string key = mesh.str() + "/" + axis;
  auto it = groups_.find(key);
  if (it != groups_.end()) return it->second;
  if (mesh.size() != size())
    throw Error("mesh " + mesh.str() + " has " + std::to_string(mesh.size()) + " ranks but the world has " +
                std::to_string(size()));
  mesh.axis_index(axis);  // throws on an unknown axis
  auto g = comm_->split(mesh.group_color(rank(), axis), mesh.coord(rank(), axis), axis);
  groups_[key] = g;
  return g;
}

std::map<std::string, std::shared_ptr<Communicator>> World::groups(const Mesh& mesh) {
  std::map<std::string, std::shared_ptr<Communicator>> out;
  for (const auto& axis : mesh.axes()) out[axis.first] = group(mesh, axis.first);
  return out;
}

CommStats World::total_stats() const {
  CommStats s = comm_->stats();
  for (const auto& g : groups_) {
    s.calls += g.second->stats().calls;
    s.bytes += g.second->stats().bytes;
  }
  return s;
}

void World::reset_stats() {
  comm_->reset_stats();
  for (auto& g : groups_) g.second->reset_stats();
}

void World::trace_step(int step) {
  if (CommTrace* t = comm_->trace()) t->step(step);
}

// ---------------------------------------------------------------- init

namespace {

// Ranks started with different world sizes would otherwise meet only in the
// backend's rendezvous and fail there with its internals (gloo: "Enforce
// failed ... sizeof(impl_) == bytes.size()"). Each rank publishes its size;
// rank 0 compares every other rank's with its own, the others rank 0's, so
// each side of a mismatch names both sizes. A store may serve several worlds
// in a row (tests), so each rank counts its own earlier ones, as the backends
// do for their keys.
void check_world_size(Store& store, const WorldOptions& o) {
  auto key = [](int gen, int rank) {
    return "shardplan/world/" + std::to_string(gen) + "/size/" + std::to_string(rank);
  };
  // This is where a rank that never arrives is first noticed: worded as a
  // failed join, like the backend's own rendezvous (docs/ARCHITECTURE.md, Faults).
  auto joining = [&](auto&& op) {
    try {
      return op();
    } catch (const Error& e) {
      throw CommError("backend '" + o.backend + "': rank " + std::to_string(o.rank) + " of " +
                          std::to_string(o.world_size) + " could not join the world: " + e.what(),
                      SP_ERR_INTERNAL);
    }
  };
  const std::string mine = std::to_string(o.world_size);
  const int gen = joining([&] {
    int g = 0;
    while (store.check(key(g, o.rank))) ++g;
    store.set(key(g, o.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    return g;
  });
  auto compare = [&](int peer) {
    const std::vector<uint8_t> v = joining([&] { return store.get(key(gen, peer), o.timeout); });
    const std::string theirs(v.begin(), v.end());
    if (theirs == mine) return;
    const bool peer_first = peer < o.rank;
    throw Error("rank " + std::to_string(peer_first ? peer : o.rank) + " was started with world size " +
                (peer_first ? theirs : mine) + " but rank " + std::to_string(peer_first ? o.rank : peer) +
                " with world size " + (peer_first ? mine : theirs) +
                ": every rank must be started with the same WORLD_SIZE");
  };
  if (o.rank != 0) return compare(0);
  for (int r = 1; r < o.world_size; ++r) compare(r);
}

std::shared_ptr<World> create_world(const WorldOptions& options, std::shared_ptr<Store> store) {
  // A bad SHARDPLAN_COMM_TRACE fails before any rank waits for another.
  std::shared_ptr<CommTrace> trace = CommTrace::from_env(options.rank, options.world_size, options.backend);
  auto& loader = PluginLoader::instance();
  loader.add_dirs(options.plugin_dirs);
  const sp_comm_api* api = loader.comm(options.backend);

  bool threads = false;
  for (const auto& opt : options.backend_options) threads = threads || opt.rfind("local_id=", 0) == 0;
  if (!threads && !(api->caps & SP_CAP_PROCESS_RANKS))
    throw Error("backend '" + options.backend +
                "' runs ranks as threads of one process (e.g. train_mlp --ranks N), not under a launcher");
  // Before anything computes: ranks of one node must not oversubscribe it.
  ThreadSettings thread_settings;
  if (options.threads >= 0)
    thread_settings = set_num_threads(options.threads, options.local_world_size, threads ? options.world_size : 1);
  // The store is optional: a backend that meets its peers by other means
  // (MPI's ranks come from mpirun) gets none, and one that needs it says so.
  const bool no_rendezvous = !store && options.world_size > 1 && !threads && options.store_url.empty();
  if (!store && options.world_size > 1 && !threads && !options.store_url.empty())
    store = make_store(options.store_url, options.rank, options.world_size, options.timeout);
  if (store && !threads && options.world_size > 1) check_world_size(*store, options);

  // A device backend picks its GPU by the rank within the node.
  std::vector<std::string> backend_options = options.backend_options;
  backend_options.push_back("local_rank=" + std::to_string(options.local_rank));
  std::vector<const char*> opts;
  for (const auto& o : backend_options) opts.push_back(o.c_str());
  opts.push_back(nullptr);
  sp_comm_config cfg{};
  cfg.struct_size = sizeof(cfg);
  cfg.rank = options.rank;
  cfg.world_size = options.world_size;
  cfg.timeout_ms = options.timeout.count();
  cfg.store = store ? store->abi() : nullptr;
  cfg.options = opts.data();
  sp_comm* comm = nullptr;
  if (api->create(&cfg, &comm) != SP_OK || !comm) {
    const char* why = api->last_error();
    // A backend that needed the store it did not get says so; then the user
    // wants to know how to give one.
    const std::string reason = why && *why ? why : "";
    const bool wants_store =
        no_rendezvous && (reason.find("store") != std::string::npos || reason.find("rendezvous") != std::string::npos);
    throw CommError("backend '" + options.backend + "': rank " + std::to_string(options.rank) + " of " +
                        std::to_string(options.world_size) + " could not join the world: " +
                        (reason.empty() ? "unknown error" : reason) +
                        (wants_store ? " (no rendezvous given: set MASTER_ADDR/MASTER_PORT or SHARDPLAN_STORE, "
                                         "or use shardplan launch)"
                                       : ""),
                    SP_ERR_INTERNAL);
  }
  auto c = std::make_shared<Communicator>(api, comm, "world", std::vector<int>{}, options.timeout);
  c->set_trace(std::move(trace));
  return std::make_shared<World>(options, std::move(store), std::move(c), std::move(thread_settings));
}

}  // namespace

std::shared_ptr<World> init_world(const WorldOptions& options) { return create_world(options, nullptr); }

void run_ranks_in_threads(int n, const std::function<void(World&)>& fn, const std::string& backend,
                          std::vector<std::string> backend_options, std::chrono::milliseconds timeout) {
  if (n < 1) throw Error("run_ranks_in_threads: need at least one rank, got " + std::to_string(n));
  static std::atomic<uint64_t> counter{0};
  std::string id = "threads-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  backend_options.push_back("local_id=" + id);
  // Threads of one process meet through memory; backends that want a store
  // (gloo) get one shared by all ranks.
  auto store = make_memory_store();
  // The ranks shrink the process-wide BLAS pool to one thread (threads.h).
  struct RestoreBlas {
    int n = blas_num_threads();
    ~RestoreBlas() {
      if (n > 0) set_blas_num_threads(n);
    }
  } restore_blas;

  std::mutex mu;
  std::vector<std::shared_ptr<World>> worlds(n);
  std::exception_ptr first_error;
  int failed_rank = -1;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        WorldOptions o;
        o.backend = backend;
        o.rank = r;
        o.world_size = n;
        o.local_rank = r;
        o.local_world_size = n;
        o.timeout = timeout;
        o.backend_options = backend_options;
        auto w = create_world(o, store);
        {
          std::lock_guard<std::mutex> lock(mu);
          worlds[r] = w;
        }
        fn(*w);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first_error) {
          first_error = std::current_exception();
          failed_rank = r;
        }
        // Peers blocked in a collective with this rank would otherwise wait
        // for the full timeout.
        for (auto& w : worlds)
          if (w) w->comm().abort();
      }
    });
  }
  for (auto& t : threads) t.join();
  worlds.clear();
  if (first_error) {
    try {
      std::rethrow_exception(first_error);
    } catch (const c10::Error& e) {
      // libtorch's own errors carry a backtrace; the caller prints one line.
      throw Error("rank " + std::to_string(failed_rank) + ": " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      throw Error("rank " + std::to_string(failed_rank) + ": " + e.what());
    }
  }
}

}  // namespace shardplan
