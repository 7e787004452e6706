// Communication backends: the conformance suite (tests/comm/conformance.h) per
// backend and world size, plus the local backend's failure behaviour (timeouts,
// abort, bad arguments) and float16/bfloat16 rounding.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "conformance.h"
#include "shardplan/plugin_loader.h"
#include "shardplan/world.h"

namespace test_comm {

namespace {

using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------------ conformance

// Backends the conformance runs on, each at world sizes 1..4.
const std::vector<std::string> kConformanceBackends = {
    "local",
    "gloo",
};

class CommConformance : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(CommConformance, AllChecksPass) {
  const std::string backend = std::get<0>(GetParam());
  const int n = std::get<1>(GetParam());
  std::mutex mu;
  shardplan::conformance::Result total;
  shardplan::run_ranks_in_threads(
      n,
      [&](shardplan::World& w) {
        auto r = shardplan::conformance::run_conformance(w.comm().api(), w.comm().raw());
        std::lock_guard<std::mutex> lock(mu);
        total.passed += r.passed;
        total.failed += r.failed;
        for (auto& f : r.failures) total.failures.push_back(f);
      },
      backend);
  for (const auto& f : total.failures) ADD_FAILURE() << f;
  EXPECT_EQ(total.failed, 0);
  EXPECT_GT(total.passed, 1000);
}

INSTANTIATE_TEST_SUITE_P(Backends, CommConformance,
                         ::testing::Combine(::testing::ValuesIn(kConformanceBackends), ::testing::Values(1, 2, 3, 4)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
                           return std::get<0>(info.param) + "_ws" + std::to_string(std::get<1>(info.param));
                         });

// ------------------------------------------------------------------ local backend, raw ABI

const sp_comm_api* local_api() { return shardplan::PluginLoader::instance().comm("local"); }

std::string unique_id(const char* what) {
  static std::atomic<int> counter{0};
  return std::string("test_comm-") + what + "-" + std::to_string(counter++);
}

sp_comm* create(int rank, int n, const std::string& id, int64_t timeout_ms, int* status = nullptr) {
  const std::string opt = "local_id=" + id;
  const char* opts[] = {opt.c_str(), nullptr};
  sp_comm_config cfg{};
  cfg.struct_size = sizeof(cfg);
  cfg.rank = rank;
  cfg.world_size = n;
  cfg.timeout_ms = timeout_ms;
  cfg.options = opts;
  sp_comm* c = nullptr;
  int st = local_api()->create(&cfg, &c);
  if (status) *status = st;
  return c;
}

// fn(rank, comm) on n threads of one fresh local group.
void with_ranks(int n, int64_t timeout_ms, const std::function<void(int, sp_comm*)>& fn) {
  const std::string id = unique_id("group");
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      int st = 0;
      sp_comm* c = create(r, n, id, timeout_ms, &st);
      ASSERT_EQ(st, SP_OK) << local_api()->last_error();
      fn(r, c);
      local_api()->destroy(c);
    });
  }
  for (auto& t : threads) t.join();
}

sp_buffer buf(void* data, uint64_t count, int32_t dtype) {
  sp_buffer b{};
  b.data = data;
  b.count = count;
  b.dtype = dtype;
  b.device_type = SP_DEVICE_CPU;
  return b;
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

TEST(CommLocal, PluginDescribesItself) {
  const sp_comm_api* api = local_api();
  EXPECT_STREQ(api->name, "local");
  EXPECT_EQ(api->abi_version, SP_COMM_ABI_VERSION);
  EXPECT_TRUE(api->caps & SP_CAP_THREAD_RANKS);
  EXPECT_TRUE(api->caps & SP_CAP_CPU);
}

TEST(CommLocal, RankThatNeverJoinsTimesOutCreate) {
  const auto t0 = Clock::now();
  int st = 0;
  sp_comm* c = create(0, 2, unique_id("never"), 200, &st);
  const double ms = ms_since(t0);
  EXPECT_EQ(st, SP_ERR_TIMEOUT);
  EXPECT_EQ(c, nullptr);
  EXPECT_GE(ms, 190);
  EXPECT_LT(ms, 5000);
  const std::string e = local_api()->last_error();
  EXPECT_NE(e.find("timed out after 200 ms"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1"), std::string::npos) << e;
}

TEST(CommLocal, RankThatNeverCallsTimesOutCollectiveAndPoisonsGroup) {
  std::atomic<bool> rank0_done{false};
  with_ranks(2, 300, [&](int r, sp_comm* c) {
    float x[4] = {1, 2, 3, 4};
    sp_buffer b = buf(x, 4, SP_FLOAT32);
    if (r == 0) {
      const auto t0 = Clock::now();
      int st = local_api()->all_reduce(c, &b, &b, SP_SUM, nullptr);
      const double ms = ms_since(t0);
      EXPECT_EQ(st, SP_ERR_TIMEOUT);
      EXPECT_GE(ms, 290);
      EXPECT_LT(ms, 5000);
      const std::string e = local_api()->last_error();
      EXPECT_NE(e.find("local all_reduce: timed out after 300 ms waiting for rank 1 of group"), std::string::npos)
          << e;
      rank0_done = true;
    } else {
      while (!rank0_done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      // Arriving late must not pair with the rank that gave up.
      int st = local_api()->all_reduce(c, &b, &b, SP_SUM, nullptr);
      EXPECT_EQ(st, SP_ERR_ABORTED);
      const std::string e = local_api()->last_error();
      EXPECT_NE(e.find("timed out"), std::string::npos) << e;
    }
  });
}

TEST(CommLocal, AbortWakesWaitingRanks) {
  with_ranks(3, 60000, [&](int r, sp_comm* c) {
    double x[8] = {};
    sp_buffer b = buf(x, 8, SP_FLOAT64);
    if (r == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      EXPECT_EQ(local_api()->abort(c), SP_OK);
      EXPECT_EQ(local_api()->all_reduce(c, &b, &b, SP_SUM, nullptr), SP_ERR_ABORTED);
    } else {
      const auto t0 = Clock::now();
      int st = local_api()->all_reduce(c, &b, &b, SP_SUM, nullptr);
      EXPECT_EQ(st, SP_ERR_ABORTED);
      EXPECT_LT(ms_since(t0), 10000);
      const std::string e = local_api()->last_error();
      EXPECT_NE(e.find("aborted"), std::string::npos) << e;
      EXPECT_NE(e.find("all_reduce"), std::string::npos) << e;
    }
  });
}

TEST(CommLocal, AbortReachesSplitGroupsAndReceives) {
  with_ranks(4, 60000, [&](int r, sp_comm* c) {
    sp_comm* sub = nullptr;
    ASSERT_EQ(local_api()->split(c, r % 2, r, &sub), SP_OK) << local_api()->last_error();
    ASSERT_NE(sub, nullptr);
    ASSERT_EQ(local_api()->barrier(c, nullptr), SP_OK);
    int32_t x = 0;
    sp_buffer b = buf(&x, 1, SP_INT32);
    if (r == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      local_api()->abort(c);
    } else if (r == 1) {
      // Waits in the sub-group for rank 3, which waits in a receive.
      EXPECT_EQ(local_api()->all_reduce(sub, &b, &b, SP_SUM, nullptr), SP_ERR_ABORTED);
    } else if (r == 3) {
      EXPECT_EQ(local_api()->recv(c, &b, 2, 9, nullptr), SP_ERR_ABORTED);
      EXPECT_EQ(local_api()->all_reduce(sub, &b, &b, SP_SUM, nullptr), SP_ERR_ABORTED);
    } else {
      EXPECT_EQ(local_api()->barrier(sub, nullptr), SP_ERR_ABORTED);
    }
    local_api()->destroy(sub);
  });
}

TEST(CommLocal, ReceiveWithoutSenderTimesOut) {
  with_ranks(2, 250, [&](int r, sp_comm* c) {
    if (r != 0) return;
    int64_t x = 0;
    sp_buffer b = buf(&x, 1, SP_INT64);
    const auto t0 = Clock::now();
    EXPECT_EQ(local_api()->recv(c, &b, 1, 4, nullptr), SP_ERR_TIMEOUT);
    EXPECT_GE(ms_since(t0), 240);
    const std::string e = local_api()->last_error();
    EXPECT_NE(e.find("local recv: timed out after 250 ms waiting for rank 1 (tag 4)"), std::string::npos) << e;
  });
}

TEST(CommLocal, WaitWithShortTimeoutLeavesWorkValid) {
  std::atomic<bool> rank0_timed_out{false};
  with_ranks(2, 60000, [&](int r, sp_comm* c) {
    float x[3] = {1.f + r, 2.f, 3.f};
    sp_buffer b = buf(x, 3, SP_FLOAT32);
    if (r == 0) {
      sp_work* w = nullptr;
      ASSERT_EQ(local_api()->all_reduce(c, &b, &b, SP_SUM, &w), SP_OK);
      EXPECT_EQ(local_api()->wait(w, 20), SP_ERR_TIMEOUT);
      int32_t done = 1;
      EXPECT_EQ(local_api()->test(w, &done), SP_OK);
      EXPECT_EQ(done, 0);
      rank0_timed_out = true;
      EXPECT_EQ(local_api()->wait(w, -1), SP_OK) << local_api()->last_error();
      local_api()->release(w);
    } else {
      while (!rank0_timed_out) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      EXPECT_EQ(local_api()->all_reduce(c, &b, &b, SP_SUM, nullptr), SP_OK);
    }
    EXPECT_EQ(x[0], 3.f);
    EXPECT_EQ(x[2], 6.f);
  });
}

TEST(CommLocal, MismatchedArgumentsFailOnEveryRank) {
  with_ranks(3, 60000, [&](int r, sp_comm* c) {
    float x[8] = {};
    // Rank 2 disagrees on the count.
    sp_buffer b = buf(x, r == 2 ? 7 : 8, SP_FLOAT32);
    EXPECT_EQ(local_api()->all_reduce(c, &b, &b, SP_SUM, nullptr), SP_ERR_INVALID);
    std::string e = local_api()->last_error();
    EXPECT_NE(e.find("disagree"), std::string::npos) << e;
    // Rank 1 names a root that does not exist.
    sp_buffer full = buf(x, 8, SP_FLOAT32);
    EXPECT_EQ(local_api()->broadcast(c, &full, &full, r == 1 ? 5 : 0, nullptr), SP_ERR_INVALID);
    e = local_api()->last_error();
    EXPECT_NE(e.find("root 5"), std::string::npos) << e;
    // Unknown op everywhere; then the group still works.
    EXPECT_EQ(local_api()->all_reduce(c, &full, &full, 42, nullptr), SP_ERR_INVALID);
    EXPECT_EQ(local_api()->all_reduce(c, &full, &full, SP_SUM, nullptr), SP_OK) << local_api()->last_error();
  });
}

TEST(CommLocal, CudaBuffersAreUnsupported) {
  with_ranks(1, 1000, [&](int, sp_comm* c) {
    float x = 0;
    sp_buffer b = buf(&x, 1, SP_FLOAT32);
    b.device_type = SP_DEVICE_CUDA;
    EXPECT_EQ(local_api()->all_reduce(c, &b, &b, SP_SUM, nullptr), SP_ERR_UNSUPPORTED);
  });
}

TEST(CommLocal, ZeroSizeBuffersMayBeNull) {
  with_ranks(2, 60000, [&](int, sp_comm* c) {
    sp_buffer b = buf(nullptr, 0, SP_FLOAT16);
    EXPECT_EQ(local_api()->all_reduce(c, &b, &b, SP_SUM, nullptr), SP_OK);
    EXPECT_EQ(local_api()->all_gather(c, &b, &b, nullptr), SP_OK);
    EXPECT_EQ(local_api()->all_to_all(c, &b, &b, nullptr), SP_OK);
  });
}

// Two addends whose exact sum lies halfway between representable values.
TEST(CommLocal, HalfPrecisionSumsRoundToNearestEven) {
  struct Case {
    int32_t dtype;
    uint16_t a, b, expect;
  };
  // float16: 2048 + 1 -> 2048 (tie, even), 2048 + 3 -> 2052 (tie, even), 2048 + 1.5 -> 2050.
  // bfloat16: 256 + 1 -> 256, 256 + 3 -> 260.
  const Case cases[] = {
      {SP_FLOAT16, 0x6800, 0x3c00, 0x6800}, {SP_FLOAT16, 0x6800, 0x4200, 0x6802},
      {SP_FLOAT16, 0x6800, 0x3e00, 0x6801}, {SP_BFLOAT16, 0x4380, 0x3f80, 0x4380},
      {SP_BFLOAT16, 0x4380, 0x4040, 0x4382},
      // float16 subnormals: 2^-24 + 2^-24 = 2^-23.
      {SP_FLOAT16, 0x0001, 0x0001, 0x0002},
  };
  with_ranks(2, 60000, [&](int r, sp_comm* c) {
    for (const Case& k : cases) {
      uint16_t x = r == 0 ? k.a : k.b;
      sp_buffer b = buf(&x, 1, k.dtype);
      ASSERT_EQ(local_api()->all_reduce(c, &b, &b, SP_SUM, nullptr), SP_OK);
      EXPECT_EQ(x, k.expect) << "dtype " << k.dtype << " " << std::hex << k.a << " + " << k.b;
    }
  });
}

// Ranks outnumbering cores must still make progress at a reasonable pace
// (waiters yield instead of spinning for their whole time slice).
TEST(CommLocal, MoreRanksThanCoresStillProgress) {
  const int n = 2 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto t0 = Clock::now();
  with_ranks(n, 60000, [&](int r, sp_comm* c) {
    float x[256];
    for (float& v : x) v = static_cast<float>(r);
    sp_buffer b = buf(x, 256, SP_FLOAT32);
    for (int i = 0; i < 500; ++i) ASSERT_EQ(local_api()->all_reduce(c, &b, &b, SP_MAX, nullptr), SP_OK);
    EXPECT_EQ(x[0], static_cast<float>(n - 1));
  });
  EXPECT_LT(ms_since(t0), 30000) << n << " ranks, 500 all_reduces";
}

}  // namespace

}  // namespace test_comm
