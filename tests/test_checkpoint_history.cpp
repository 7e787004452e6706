// The examples' checkpoint history (examples/models/checkpoint_history.h,
// issue 33 item 7) with a stand-in for load_checkpoint: the candidates'
// order, and ranks that disagree about one checkpoint (rank 1 alone fails
// to load the newest) all skip it and go on from the same older one, with
// one line naming the rank and its reason. The real loads and saves:
// tests/e2e/ckpt_keep.sh and tests/e2e/restart_corrupt.sh.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "models/checkpoint_history.h"
#include "shardplan/error.h"
#include "shardplan/world.h"

namespace test_checkpoint_history {

namespace {

namespace fs = std::filesystem;
namespace ex = shardplan::examples;

struct TempFamily {
  fs::path base = fs::temp_directory_path() / ("shardplan_history_" + std::to_string(::getpid()));
  fs::path dir = base / "run";
  TempFamily() {
    fs::remove_all(base);
    for (const char* name : {"run", "run.step-4", "run.step-10", "run.step-x", "run.step-8.removing"}) {
      fs::create_directories(base / name);
      std::ofstream(base / name / "metadata.yaml") << "x";
    }
    fs::create_directories(base / "run.step-6.partial");
  }
  ~TempFamily() {
    std::error_code ec;
    fs::remove_all(base, ec);
  }
};

}  // namespace

TEST(CheckpointHistory, CandidatesAreDirThenKeptCopiesNewestFirst) {
  TempFamily t;
  const std::vector<std::string> want = {t.dir.string(), (t.base / "run.step-10").string(),
                                         (t.base / "run.step-4").string()};
  EXPECT_EQ(ex::resume_candidates(t.dir.string()), want);
  EXPECT_EQ(ex::resume_candidates(t.dir.string() + "/"), want);
  fs::remove_all(t.dir);
  fs::create_directories(t.dir);  // empty: not a checkpoint
  EXPECT_EQ(ex::resume_candidates(t.dir.string()).size(), 2u);
}

TEST(CheckpointHistory, RanksThatDisagreeAllSkipTheCheckpoint) {
  TempFamily t;
  std::mutex mu;
  std::map<int, std::string> from;
  std::map<int, std::vector<std::string>> tried;
  testing::internal::CaptureStdout();
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
    ex::CheckpointHistory history(t.dir.string(), 2);
    std::string f;
    auto got = history.resume(
        w,
        [&](const std::string& dir) {
          {
            std::lock_guard<std::mutex> lock(mu);
            tried[w.rank()].push_back(dir);
          }
          if (dir == t.dir.string() && w.rank() == 1) throw shardplan::Error("rank 1 sees a bad checksum");
          return ex::CheckpointHistory::Attributes{{"step", "7"}};
        },
        &f);
    ASSERT_TRUE(got.has_value());
    std::lock_guard<std::mutex> lock(mu);
    from[w.rank()] = f;
  });
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(from[0], (t.base / "run.step-10").string());
  EXPECT_EQ(from[1], from[0]);
  EXPECT_EQ(tried[0], tried[1]);
  EXPECT_EQ(out, "warning: --resume auto skipped checkpoint '" + t.dir.string() +
                     "': rank 1: rank 1 sees a bad checksum\n");
}

TEST(CheckpointHistory, NoneLoadingIsOneErrorNamingEach) {
  TempFamily t;
  testing::internal::CaptureStdout();
  try {
    shardplan::run_ranks_in_threads(1, [&](shardplan::World& w) {
      ex::CheckpointHistory history(t.dir.string(), 2);
      std::string f;
      history.resume(
          w, [](const std::string& dir) -> ex::CheckpointHistory::Attributes { throw shardplan::Error("bad " + dir); },
          &f);
    });
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--resume auto: none of the 3 checkpoint(s) of --save " + t.dir.string() + " loads: bad " +
                        t.dir.string() + "; bad "),
              std::string::npos)
        << what;
  }
  testing::internal::GetCapturedStdout();
}

}  // namespace test_checkpoint_history
