// The per-call communication trace (SHARDPLAN_COMM_TRACE): each thread rank
// writes its own rank<N>.jsonl with one line per call, in order, the times
// monotone, an asynchronous call's wait beginning at Work::wait(); bad values
// of the variable are one-line errors; off, nothing is written.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "shardplan/error.h"
#include "shardplan/mesh.h"
#include "shardplan/world.h"

namespace test_comm_trace {

namespace {

namespace fs = std::filesystem;
using shardplan::World;

class TraceEnv {
 public:
  explicit TraceEnv(const std::string& value) { setenv("SHARDPLAN_COMM_TRACE", value.c_str(), 1); }
  ~TraceEnv() { unsetenv("SHARDPLAN_COMM_TRACE"); }
};

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("shardplan_comm_trace_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The value of "key" in one of the trace's flat JSON lines ("" when absent).
std::string field(const std::string& line, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(line, m, std::regex("\"" + key + "\":(\"[^\"]*\"|[^,}]+)"))) return "";
  std::string v = m[1];
  return v.front() == '"' ? v.substr(1, v.size() - 2) : v;
}

double num(const std::string& line, const std::string& key) { return std::stod(field(line, key)); }

void run_calls(World& w) {
  w.trace_step(1);
  at::Tensor a = at::ones({4}, at::kFloat);
  w.comm().all_reduce(a);
  w.comm().all_gather(at::ones({2, 3}, at::kFloat));
  auto data = w.group(shardplan::Mesh({{"data", 2}}), "data");
  w.trace_step(2);
  at::Tensor b = at::ones({16}, at::kDouble);
  auto work = data->all_reduce_async(b);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  work->wait();
  w.comm().barrier();
}

TEST(CommTrace, ThreadRanksWriteOneLinePerCallInOrder) {
  const fs::path dir = fresh_dir("calls");
  {
    TraceEnv env(dir.string());
    shardplan::run_ranks_in_threads(2, run_calls);
  }
  for (int rank = 0; rank < 2; ++rank) {
    const auto lines = lines_of(dir / ("rank" + std::to_string(rank) + ".jsonl"));
    ASSERT_EQ(lines.size(), 7u) << rank;
    EXPECT_EQ(field(lines[0], "meta"), "comm_trace");
    EXPECT_EQ(field(lines[0], "rank"), std::to_string(rank));
    EXPECT_EQ(field(lines[0], "world_size"), "2");
    // The split's own exchange of world ranks is set-up, not traced.
    const std::vector<std::vector<std::string>> want = {
        {"step", "1"},
        {"all_reduce", "1", "world", "false", "16", "float32"},
        {"all_gather", "1", "world", "false", "24", "float32"},
        {"step", "2"},
        {"all_reduce", "2", "data", "true", "128", "float64"},
        {"barrier", "2", "world", "false", "0", "uint8"},
    };
    const std::vector<std::string> calls(lines.begin() + 1, lines.end());
    double last = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const std::string& l = calls[i];
      EXPECT_EQ(field(l, "op"), want[i][0]) << l;
      EXPECT_EQ(field(l, "step"), want[i][1]) << l;
      if (want[i][0] == "step") {
        EXPECT_GE(num(l, "t"), last) << l;
        last = num(l, "t");
        continue;
      }
      EXPECT_EQ(field(l, "group"), want[i][2]) << l;
      EXPECT_EQ(field(l, "async"), want[i][3]) << l;
      EXPECT_EQ(field(l, "bytes"), want[i][4]) << l;
      EXPECT_EQ(field(l, "dtype"), want[i][5]) << l;
      EXPECT_GE(num(l, "t_issue"), last) << l;
      EXPECT_LE(num(l, "t_issue"), num(l, "t_wait_begin")) << l;
      EXPECT_LE(num(l, "t_wait_begin"), num(l, "t_done")) << l;
      last = num(l, "t_done");
    }
    // A synchronous call's caller waits from its issue; the asynchronous
    // one's from wait(), after the 30 ms the caller spent elsewhere.
    EXPECT_EQ(num(calls[1], "t_wait_begin"), num(calls[1], "t_issue"));
    EXPECT_GE(num(calls[4], "t_wait_begin") - num(calls[4], "t_issue"), 30000.0) << calls[4];
    // ... and it says when the issuing call returned, before the wait.
    EXPECT_EQ(field(calls[1], "t_issue_end"), "");
    EXPECT_LE(num(calls[4], "t_issue"), num(calls[4], "t_issue_end")) << calls[4];
    EXPECT_LE(num(calls[4], "t_issue_end") + 30000.0, num(calls[4], "t_wait_begin")) << calls[4];
  }
  fs::remove_all(dir);
}

TEST(CommTrace, StepMarkerWritesPastTheBoundBeforeTheWorldEnds) {
  const fs::path dir = fresh_dir("bound");
  TraceEnv env(dir.string());
  shardplan::run_ranks_in_threads(2, [&](World& w) {
    w.trace_step(1);
    const fs::path mine = dir / ("rank" + std::to_string(w.rank()) + ".jsonl");
    // ~100 bytes a line: past 1 MiB of text in memory.
    for (int i = 0; i < 12000; ++i) w.comm().barrier();
    EXPECT_EQ(fs::file_size(mine), 0u);
    w.trace_step(2);
    EXPECT_GT(fs::file_size(mine), size_t(1) << 20);
  });
  EXPECT_EQ(lines_of(dir / "rank1.jsonl").size(), 1u + 2u + 12000u);
  fs::remove_all(dir);
}

TEST(CommTrace, OffWritesNothing) {
  unsetenv("SHARDPLAN_COMM_TRACE");
  shardplan::run_ranks_in_threads(2, [](World& w) {
    EXPECT_EQ(w.comm().trace(), nullptr);
    w.trace_step(1);
    at::Tensor a = at::ones({4});
    w.comm().all_reduce(a);
    EXPECT_EQ(a[0].item<float>(), 2.0f);
  });
}

std::string error_of(const std::string& value) {
  TraceEnv env(value);
  try {
    shardplan::run_ranks_in_threads(2, [](World&) {});
  } catch (const shardplan::Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(CommTrace, BadDirectoryIsOneLineError) {
  const fs::path dir = fresh_dir("bad");
  fs::create_directories(dir);
  const fs::path file = dir / "a_file";
  std::ofstream(file) << "x";
  const std::string not_dir = error_of(file.string());
  EXPECT_NE(not_dir.find("SHARDPLAN_COMM_TRACE='" + file.string() + "' is not a directory"), std::string::npos)
      << not_dir;
  const std::string missing_parent = error_of((dir / "no" / "such").string());
  EXPECT_NE(missing_parent.find("' cannot be created: No such file or directory"), std::string::npos)
      << missing_parent;
  EXPECT_EQ(missing_parent.find('\n'), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace

}  // namespace test_comm_trace
