// The environment `shardplan launch` gives each rank (torchrun's variables,
// shardplan's, threads), and mpirun's command line and environment.
#include "launch_internal.h"
#include "thread_env.h"

extern char** environ;

namespace shardplan_cli {
namespace launcher {

std::vector<std::string> Launcher::environment_for(int local_rank) const {
  std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(opt_.node_rank * opt_.nproc + local_rank)},
      {"WORLD_SIZE", std::to_string(opt_.nnodes * opt_.nproc)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(opt_.nproc)},
      {"GROUP_RANK", std::to_string(opt_.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(opt_.nnodes)},
      {"MASTER_ADDR", opt_.master_addr},
      {"MASTER_PORT", std::to_string(opt_.master_port)},
      {"SHARDPLAN_BACKEND", opt_.backend},
      {"SHARDPLAN_STORE", store_url_},
      // Names this job's shared-memory segments (launch_shm_cleanup.cpp).
      {"SHARDPLAN_JOB_ID", job_id()},
      {"SHARDPLAN_RESTART_COUNT", std::to_string(opt_.restart)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(opt_.restart)},
  };
  // Without the option, a value the user exported is passed through untouched.
  if (opt_.has_local_addr) ours.emplace_back("SHARDPLAN_LOCAL_ADDR", opt_.local_addr);
  if (opt_.has_timeout) ours.emplace_back("SHARDPLAN_TIMEOUT_MS", std::to_string(opt_.timeout_ms));
  // Several ranks per node each running full-width libtorch and BLAS pools
  // oversubscribe the cores many times over. A value the user set wins.
  for (auto& kv : thread_environment(opt_.nproc)) ours.push_back(std::move(kv));

  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const char* eq = strchr(*e, '=');
    std::string name = eq ? std::string(*e, static_cast<size_t>(eq - *e)) : std::string(*e);
    if (std::none_of(ours.begin(), ours.end(), [&](const auto& kv) { return kv.first == name; }))
      env.emplace_back(*e);
  }
  for (const auto& kv : ours) env.push_back(kv.first + "=" + kv.second);
  return env;
}

// mpirun's own environment, which its local ranks inherit. torchrun's
// variables go: WorldOptions::from_env prefers them to Open MPI's, and an
// inherited SHARDPLAN_STORE would point the ranks at a stale rendezvous.
std::vector<std::string> Launcher::environment_for_mpirun() const {
  static const char* const kDropped[] = {"RANK",        "WORLD_SIZE",       "LOCAL_RANK",  "LOCAL_WORLD_SIZE",
                                         "GROUP_RANK",  "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                         "SHARDPLAN_STORE"};
  // mpirun ends the job when a rank fails and the launcher starts a new
  // mpirun, so restarts work as with the other backends: the count goes along.
  std::vector<std::pair<std::string, std::string>> ours = {
      {"SHARDPLAN_BACKEND", opt_.backend},
      {"SHARDPLAN_RESTART_COUNT", std::to_string(opt_.restart)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(opt_.restart)}};
  if (opt_.has_timeout) ours.emplace_back("SHARDPLAN_TIMEOUT_MS", std::to_string(opt_.timeout_ms));
  for (auto& kv : thread_environment(opt_.nproc)) ours.push_back(std::move(kv));
  // Open MPI refuses root unless told twice; as root the user has already
  // chosen to run the job so, and the launcher's other backends do not ask.
  if (geteuid() == 0) {
    if (!getenv("OMPI_ALLOW_RUN_AS_ROOT")) ours.emplace_back("OMPI_ALLOW_RUN_AS_ROOT", "1");
    if (!getenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")) ours.emplace_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  }
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const char* eq = strchr(*e, '=');
    std::string name = eq ? std::string(*e, static_cast<size_t>(eq - *e)) : std::string(*e);
    if (std::any_of(std::begin(kDropped), std::end(kDropped), [&](const char* d) { return name == d; })) continue;
    if (std::none_of(ours.begin(), ours.end(), [&](const auto& kv) { return kv.first == name; }))
      env.emplace_back(*e);
  }
  for (const auto& kv : ours) env.push_back(kv.first + "=" + kv.second);
  return env;
}

std::vector<std::string> Launcher::mpirun_command(const std::vector<std::string>& env) const {
  const char* custom = getenv("SHARDPLAN_MPIRUN");
  std::vector<std::string> argv = {custom && *custom ? custom : "mpirun", "-np", std::to_string(opt_.nproc),
                                   // The launcher never limits ranks to cores,
                                   // nor pins them; neither should mpirun.
                                   "--oversubscribe", "--bind-to", "none", "--tag-output"};
  // Local ranks inherit mpirun's environment anyway; -x also carries these
  // to a remote node once mpirun is given one.
  for (const std::string& e : env) {
    const std::string name = e.substr(0, e.find('='));
    if (name.compare(0, 10, "SHARDPLAN_") == 0 || name == "OMP_NUM_THREADS" || name == "OPENBLAS_NUM_THREADS" ||
        name == "TORCHELASTIC_RESTART_COUNT") {
      argv.push_back("-x");
      argv.push_back(name);
    }
  }
  argv.push_back("--");
  argv.insert(argv.end(), opt_.program.begin(), opt_.program.end());
  return argv;
}

}  // namespace launcher
}  // namespace shardplan_cli
