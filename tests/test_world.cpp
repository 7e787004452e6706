// Worlds: environment parsing, mesh groups over real communicators, and a
// failing rank that must not leave the others waiting.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "shardplan/error.h"
#include "shardplan/mesh.h"
#include "shardplan/world.h"

namespace test_world {

namespace {

using shardplan::World;
using shardplan::WorldOptions;

class EnvGuard {
 public:
  explicit EnvGuard(std::vector<std::pair<std::string, std::string>> vars) {
    for (const char* k : kAll) {
      if (const char* v = std::getenv(k)) saved_.emplace_back(k, v);
      unsetenv(k);
    }
    for (auto& kv : vars) setenv(kv.first.c_str(), kv.second.c_str(), 1);
  }
  ~EnvGuard() {
    for (const char* k : kAll) unsetenv(k);
    for (auto& kv : saved_) setenv(kv.first.c_str(), kv.second.c_str(), 1);
  }

 private:
  static constexpr const char* kAll[] = {
      "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
      "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
      "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
      "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_JOB_ID", "PMI_RANK",
      "PMIX_RANK",
      "SHARDPLAN_BACKEND", "SHARDPLAN_STORE", "SHARDPLAN_TIMEOUT_MS", "SHARDPLAN_LOCAL_ADDR"};
  std::vector<std::pair<std::string, std::string>> saved_;
};

// from_env()'s error under exactly `vars`, "" when there is none.
std::string from_env_error(std::vector<std::pair<std::string, std::string>> vars) {
  EnvGuard env(std::move(vars));
  try {
    WorldOptions::from_env();
  } catch (const shardplan::Error& e) {
    return e.what();
  }
  return "";
}

TEST(WorldOptions, TorchrunVariables) {
  EnvGuard env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "1234"}, {"SHARDPLAN_LOCAL_ADDR", "127.0.0.2"},
                {"SHARDPLAN_TIMEOUT_MS", "1500"}});
  auto o = WorldOptions::from_env();
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.local_rank, 1);
  EXPECT_EQ(o.local_world_size, 2);
  EXPECT_EQ(o.backend, "gloo");
  EXPECT_EQ(o.store_url, "tcp://10.1.2.3:1234");
  EXPECT_EQ(o.timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(o.backend_options, std::vector<std::string>{"local_addr=127.0.0.2"});
  EXPECT_TRUE(WorldOptions::env_has_job());
}

TEST(WorldOptions, OpenMPIAndSlurmVariables) {
  {
    EnvGuard env({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "6"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}, {"SHARDPLAN_STORE", "file:///tmp/x"}});
    auto o = WorldOptions::from_env();
    EXPECT_EQ(o.rank, 2);
    EXPECT_EQ(o.world_size, 6);
    EXPECT_EQ(o.local_world_size, 3);
    EXPECT_EQ(o.store_url, "file:///tmp/x");
    EXPECT_EQ(o.backend, "mpi");  // started by mpirun, no choice made
  }
  {
    EnvGuard env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"SLURM_STEP_ID", "0"},
                  {"SLURM_NTASKS_PER_NODE", "4(x2)"}, {"SHARDPLAN_BACKEND", "mpi"}, {"PMIX_RANK", "5"}});
    auto o = WorldOptions::from_env();
    EXPECT_EQ(o.rank, 5);
    EXPECT_EQ(o.world_size, 8);
    EXPECT_EQ(o.local_rank, 1);
    EXPECT_EQ(o.local_world_size, 4);
    EXPECT_EQ(o.backend, "mpi");
  }
}

// srun sets SLURM_NTASKS_PER_NODE only with --ntasks-per-node; the ranks on
// a node are entry SLURM_NODEID of SLURM_(STEP_)TASKS_PER_NODE, "2(x3),1".
TEST(WorldOptions, SlurmTasksPerNodeIndexedByNodeId) {
  auto local_size = [](const char* node, const char* list) {
    EnvGuard env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "7"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NODEID", node},
                  {"SLURM_TASKS_PER_NODE", list}});
    return WorldOptions::from_env().local_world_size;
  };
  EXPECT_EQ(local_size("0", "2(x3),1"), 2);
  EXPECT_EQ(local_size("2", "2(x3),1"), 2);
  EXPECT_EQ(local_size("3", "2(x3),1"), 1);
  EXPECT_EQ(local_size("1", "4,3"), 3);
  {
    // The step's layout wins over the job's.
    EnvGuard env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NODEID", "0"},
                  {"SLURM_TASKS_PER_NODE", "4"}, {"SLURM_STEP_TASKS_PER_NODE", "2"}});
    EXPECT_EQ(WorldOptions::from_env().local_world_size, 2);
  }
  auto message = [](const char* node, const char* list) {
    return from_env_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"},
                           {"SLURM_NODEID", node}, {"SLURM_TASKS_PER_NODE", list}});
  };
  EXPECT_EQ(message("4", "2(x3),1"), "SLURM_NODEID=4 is beyond the 4 node(s) of SLURM_TASKS_PER_NODE='2(x3),1'");
  for (const char* bad : {"2(x3", "2(3)", "x", "2,", "2(x0)", "-1", "2)x"})
    EXPECT_EQ(message("0", bad), std::string("SLURM_TASKS_PER_NODE='") + bad +
                                     "' is not a list of counts per node (Slurm's N or N(xM), comma separated)")
        << bad;
}

TEST(WorldOptions, SlurmBatchScriptAndMpiWithoutPmixAreOneLine) {
  EXPECT_EQ(from_env_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "7"}}),
            "SLURM_NTASKS=2, but this process is not a task of an srun step (it is job 7's batch script): start the "
            "ranks with srun (docs/SLURM.md)");
  EXPECT_EQ(from_env_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}), "");
  const std::string mpi = from_env_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"},
                                   {"SHARDPLAN_BACKEND", "mpi"}});
  EXPECT_EQ(mpi.rfind("backend 'mpi' under srun needs Slurm's PMIx: run srun --mpi=pmix", 0), 0u) << mpi;
  EXPECT_EQ(from_env_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}, {"PMIX_RANK", "0"},
                     {"SHARDPLAN_BACKEND", "mpi"}}),
            "");
}

TEST(WorldOptions, NoJobMeansOneLocalRank) {
  EnvGuard env({});
  auto o = WorldOptions::from_env();
  EXPECT_FALSE(WorldOptions::env_has_job());
  EXPECT_EQ(o.rank, 0);
  EXPECT_EQ(o.world_size, 1);
  EXPECT_EQ(o.backend, "local");
}

TEST(WorldOptions, BadValuesAreOneLineErrors) {
  EnvGuard env({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
  EXPECT_THROW(WorldOptions::from_env(), shardplan::Error);
  EnvGuard env2({{"RANK", "x"}, {"WORLD_SIZE", "4"}});
  try {
    WorldOptions::from_env();
    FAIL();
  } catch (const shardplan::Error& e) {
    EXPECT_EQ(std::string(e.what()), "RANK='x' is not a rank or a count (a whole number from 0 to 16777216)");
  }
}

// Every variable is read as strictly as the option it stands for: a typo
// ("5s", "3x", "yes") is an error naming the variable, never a silent 5 or 0.
TEST(WorldOptions, EveryVariableIsValidatedLikeItsOption) {
  EXPECT_EQ(from_env_error({{"SHARDPLAN_TIMEOUT_MS", "5s"}}),
            "SHARDPLAN_TIMEOUT_MS='5s' is not a timeout in milliseconds (a whole number from 1 to 1000000000000)");
  EXPECT_EQ(from_env_error({{"SHARDPLAN_TIMEOUT_MS", "0"}}).substr(0, 24), "SHARDPLAN_TIMEOUT_MS='0'");
  EXPECT_EQ(from_env_error({{"RANK", "1"}, {"WORLD_SIZE", "4x"}}),
            "WORLD_SIZE='4x' is not a rank or a count (a whole number from 0 to 16777216)");
  EXPECT_EQ(from_env_error({{"RANK", "0"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500a"}}),
            "MASTER_PORT='29500a' is not a TCP port (a whole number from 1 to 65535)");
  EXPECT_EQ(from_env_error(
                {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS_PER_NODE", "two"}}),
            "SLURM_NTASKS_PER_NODE='two' is not a count (a whole number, or Slurm's N(xM))");
  EXPECT_EQ(from_env_error({{"SHARDPLAN_TIMEOUT_MS", "250"}}), "");
}

TEST(World, MissingRendezvousIsAClearError) {
  WorldOptions o;
  o.backend = "gloo";
  o.rank = 1;
  o.world_size = 2;
  try {
    shardplan::init_world(o);
    FAIL();
  } catch (const shardplan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no rendezvous given"), std::string::npos) << e.what();
  }
}

TEST(World, LocalBackendRefusesProcessRanks) {
  WorldOptions o;
  o.backend = "local";
  o.rank = 0;
  o.world_size = 2;
  o.store_url = "tcp://127.0.0.1:1";
  try {
    shardplan::init_world(o);
    FAIL();
  } catch (const shardplan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("runs ranks as threads of one process"), std::string::npos) << e.what();
  }
}

// Ranks started with different world sizes met only in gloo's rendezvous,
// which failed with its internals ("sizeof(impl_) == bytes.size()"). Both
// now say which sizes differ, before the backend's rendezvous.
TEST(World, DifferentWorldSizesAreNamedAtRendezvous) {
  const std::string dir = std::filesystem::weakly_canonical(::testing::TempDir()).string() + "/ws_mismatch_" +
                          std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::string errors[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      WorldOptions o;
      o.backend = "gloo";
      o.rank = r;
      o.world_size = r == 0 ? 2 : 3;
      o.store_url = "file://" + dir + "/store";
      o.timeout = std::chrono::seconds(20);
      try {
        shardplan::init_world(o);
      } catch (const shardplan::Error& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (const auto& e : errors)
    EXPECT_EQ(e, "rank 0 was started with world size 2 but rank 1 with world size 3: every rank must be started "
                 "with the same WORLD_SIZE");
  std::filesystem::remove_all(dir);
}

// --backend names a plugin, never a file (relative paths would resolve
// against the working directory).
TEST(World, BackendIsANameNotAPath) {
  WorldOptions o;
  o.backend = "./libshardplan_comm_local.so";
  EXPECT_THROW(shardplan::init_world(o), shardplan::PluginError);
}

// {data: 2, model: 2}: the model groups are {0,1},{2,3}, the data groups
// {0,2},{1,3}; a reduction in each sums exactly its members.
TEST(World, TwoDimensionalMeshGroups) {
  shardplan::Mesh mesh({{"data", 2}, {"model", 2}});
  std::vector<std::vector<int>> model_ranks(4), data_ranks(4);
  std::vector<double> model_sum(4), data_sum(4);
  shardplan::run_ranks_in_threads(4, [&](World& w) {
    auto groups = w.groups(mesh);
    const int r = w.rank();
    model_ranks[r] = groups.at("model")->ranks();
    data_ranks[r] = groups.at("data")->ranks();
    auto x = torch::full({1}, double(1 << r), torch::kDouble);
    groups.at("model")->all_reduce(x);
    model_sum[r] = x.item<double>();
    auto y = torch::full({1}, double(1 << r), torch::kDouble);
    groups.at("data")->all_reduce(y);
    data_sum[r] = y.item<double>();
    EXPECT_EQ(groups.at("model")->rank(), mesh.coord(r, "model"));
    EXPECT_EQ(groups.at("data")->rank(), mesh.coord(r, "data"));
    EXPECT_EQ(w.group(mesh, "model"), groups.at("model"));  // cached, no second split
  });
  EXPECT_EQ(model_ranks[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(model_ranks[3], (std::vector<int>{2, 3}));
  EXPECT_EQ(data_ranks[1], (std::vector<int>{1, 3}));
  EXPECT_EQ(data_ranks[2], (std::vector<int>{0, 2}));
  EXPECT_EQ(model_sum, (std::vector<double>{3, 3, 12, 12}));
  EXPECT_EQ(data_sum, (std::vector<double>{5, 10, 5, 10}));
}

TEST(World, FailingRankAbortsPeersInsteadOfHanging) {
  auto start = std::chrono::steady_clock::now();
  try {
    shardplan::run_ranks_in_threads(
        3,
        [](World& w) {
          if (w.rank() == 1) throw std::runtime_error("boom");
          auto x = torch::ones({4});
          w.comm().all_reduce(x);  // rank 1 never comes
        },
        "local", {}, std::chrono::seconds(60));
    FAIL() << "no error";
  } catch (const shardplan::Error& e) {
    EXPECT_EQ(std::string(e.what()), "rank 1: boom");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace

}  // namespace test_world
