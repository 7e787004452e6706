// shardplan/threads.h: one setting for libtorch's intra-op threads and the
// BLAS pool, a default that does not oversubscribe, and what worlds apply.
#include <ATen/Parallel.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "shardplan/error.h"
#include "shardplan/threads.h"
#include "shardplan/world.h"

namespace test_threads {

using namespace shardplan;

namespace {

// Every test leaves the process's pools and environment as it found them.
class Threads : public ::testing::Test {
 protected:
  static constexpr const char* kVars[] = {"SHARDPLAN_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                          "SLURM_CPUS_PER_TASK"};
  void SetUp() override {
    intra_ = at::get_num_threads();
    blas_ = blas_num_threads();
    for (const char* v : kVars) {
      const char* value = std::getenv(v);
      saved_.push_back(value ? std::optional<std::string>(value) : std::nullopt);
      unsetenv(v);
    }
  }
  void TearDown() override {
    for (size_t i = 0; i < saved_.size(); ++i) {
      if (saved_[i]) setenv(kVars[i], saved_[i]->c_str(), 1);
      else unsetenv(kVars[i]);
    }
    at::set_num_threads(intra_);
    if (blas_ > 0) set_blas_num_threads(blas_);
  }
  int intra_ = 0, blas_ = 0;
  std::vector<std::optional<std::string>> saved_;
};

}  // namespace

TEST_F(Threads, LibtorchLinksOpenBlas) {
  // scripts/setup-deps.sh installs OpenBLAS as libblas.so.3; without it the
  // BLAS half of the setting could not be checked (nor set).
  EXPECT_GT(blas_num_threads(), 0);
}

// A rank of its own gives its threads to OpenBLAS and keeps libtorch's
// OpenMP pool at one: 2 x 2 on 2 cores trained at half the speed of 1 x 2
// (benchmarks/threads/compare_threads.sh, docs/THREADS.md).
TEST_F(Threads, OneSettingForBothPools) {
  ThreadSettings s = set_num_threads(1);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_EQ(blas_num_threads(), 1);
  EXPECT_EQ(s.threads, 1);
  EXPECT_EQ(s.intra_op, 1);
  EXPECT_EQ(s.blas, 1);
  EXPECT_EQ(s.source, "argument");
  s = set_num_threads(2);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_EQ(blas_num_threads(), 2);
  EXPECT_EQ(s.str().rfind("2 per rank (intra-op 1, BLAS 2; 1 rank on ", 0), 0u) << s.str();
}

TEST_F(Threads, RanksAsThreadsGetABlasPoolOfOne) {
  const ThreadSettings s = set_num_threads(2, 2, 2);
  EXPECT_EQ(s.intra_op, 2);
  EXPECT_EQ(s.blas, 1);
}

TEST_F(Threads, DefaultSharesTheCoresOutAmongTheRanks) {
  const int cores = available_cores();
  ASSERT_GE(cores, 1);
  for (int ranks : {1, 2, 3, 4, 64}) {
    EXPECT_EQ(default_num_threads(ranks), std::max(1, cores / ranks)) << ranks;
    const ThreadSettings s = set_num_threads(0, ranks);
    EXPECT_EQ(s.threads, std::max(1, cores / ranks)) << ranks;
    EXPECT_EQ(s.blas, s.threads) << ranks;
    EXPECT_EQ(s.intra_op, 1) << ranks;
    EXPECT_EQ(s.source, "default");
    EXPECT_LE(static_cast<long>(s.threads) * ranks, std::max(cores, ranks)) << "oversubscribed at " << ranks;
  }
}

TEST_F(Threads, EnvironmentVariableOverridesTheDefault) {
  setenv("SHARDPLAN_NUM_THREADS", "3", 1);
  ThreadSettings s = set_num_threads(0, 2);
  EXPECT_EQ(s.threads, 3);
  EXPECT_EQ(s.blas, 3);
  EXPECT_EQ(s.source, "SHARDPLAN_NUM_THREADS");
  s = set_num_threads(1, 2);  // an explicit argument wins over the variable
  EXPECT_EQ(s.threads, 1);
  EXPECT_EQ(s.blas, 1);
}

TEST_F(Threads, TorchUsersVariablesAreRespected) {
  setenv("OMP_NUM_THREADS", "2", 1);
  ThreadSettings s = set_num_threads(0, 4);
  EXPECT_EQ(s.threads, 2);
  EXPECT_EQ(s.blas, 2);
  EXPECT_EQ(s.source, "OMP_NUM_THREADS");
  setenv("SHARDPLAN_NUM_THREADS", "1", 1);  // ours first
  EXPECT_EQ(set_num_threads(0, 4).threads, 1);
  // A pool size exported for OpenBLAS alone stays, unless a number is given.
  set_blas_num_threads(2);
  setenv("OPENBLAS_NUM_THREADS", "2", 1);
  s = set_num_threads(0, 1);
  EXPECT_EQ(s.intra_op, 1);
  EXPECT_EQ(s.blas, 2);
  EXPECT_EQ(set_num_threads(1).blas, 1);
}

// srun -c N: what Slurm gave each task, after the variables a user sets.
TEST_F(Threads, SlurmCpusPerTaskIsTheDefault) {
  setenv("SLURM_CPUS_PER_TASK", "3", 1);
  ThreadSettings s = set_num_threads(0, 4);
  EXPECT_EQ(s.threads, 3);
  EXPECT_EQ(s.source, "SLURM_CPUS_PER_TASK");
  EXPECT_EQ(set_num_threads(0, 2, 2).threads, 1);  // two thread ranks share the task's 3
  setenv("OMP_NUM_THREADS", "2", 1);
  EXPECT_EQ(set_num_threads(0, 4).threads, 2);
  unsetenv("OMP_NUM_THREADS");
  setenv("SLURM_CPUS_PER_TASK", "x", 1);
  EXPECT_THROW(set_num_threads(0), Error);
}

TEST_F(Threads, BadValuesAreErrors) {
  EXPECT_THROW(set_num_threads(-1), Error);
  for (const char* bad : {"x", "0", "-2", "3x", "99999"}) {
    setenv("SHARDPLAN_NUM_THREADS", bad, 1);
    try {
      set_num_threads(0);
      ADD_FAILURE() << "accepted SHARDPLAN_NUM_THREADS=" << bad;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("SHARDPLAN_NUM_THREADS")) << bad;
    }
  }
}

TEST_F(Threads, OversubscriptionIsWarnedAbout) {
  // Once per process: a child re-executed for this test alone has not warned
  // yet, where a forked one inherits the flag of earlier tests.
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  const int cores = available_cores();
  EXPECT_EXIT(
      {
        set_num_threads(cores, 2);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "2 rank\\(s\\) x [0-9]+ thread\\(s\\) exceed the [0-9]+ core\\(s\\)");
}

TEST_F(Threads, WorldsOfThreadRanksApplyTheDefault) {
  set_blas_num_threads(2);
  const int cores = available_cores();
  std::mutex mu;
  std::vector<ThreadSettings> seen(4);
  std::vector<int> intra(4), blas(4);
  run_ranks_in_threads(4, [&](World& w) {
    std::lock_guard<std::mutex> lock(mu);
    seen[w.rank()] = w.threads();
    intra[w.rank()] = at::get_num_threads();
    blas[w.rank()] = blas_num_threads();
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(intra[r], std::max(1, cores / 4)) << r;
    EXPECT_EQ(blas[r], 1) << r;
    EXPECT_EQ(seen[r].intra_op, intra[r]) << r;
    EXPECT_EQ(seen[r].ranks, 4) << r;
  }
  EXPECT_EQ(blas_num_threads(), 2) << "the BLAS pool was not put back";
}

}  // namespace test_threads
