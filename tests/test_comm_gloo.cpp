// The gloo plugin's failure behaviour through the raw C ABI: a peer that
// vanishes, a peer that never comes, abort (also through splits), rendezvous
// without the framework (file_store=), half-precision rounding, and the
// emulated slow link (link_gbps=), and the 2-rank all_reduce over TCP bit for
// bit against gloo's ring (tcp_all_reduce=). The conformance suite (test_comm.cpp, comm_gloo.cmake) covers the results.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shardplan/plugin_loader.h"
#include "shardplan/store.h"

namespace test_comm_gloo {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const sp_comm_api* gloo_api() { return shardplan::PluginLoader::instance().comm("gloo"); }

sp_buffer cpu(void* data, uint64_t count, int32_t dtype) {
  sp_buffer b{};
  b.data = data;
  b.count = count;
  b.dtype = dtype;
  b.device_type = SP_DEVICE_CPU;
  return b;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// n communicators meeting through one memory store, created on n threads
// (creation is collective).
struct Group {
  const sp_comm_api* api = gloo_api();
  std::shared_ptr<shardplan::Store> store = shardplan::make_memory_store();
  std::vector<sp_comm*> comms;

  Group(int n, int64_t timeout_ms, const char* const* options = nullptr) : comms(n, nullptr) {
    std::vector<std::thread> ts;
    std::vector<int> rcs(n, -1);
    std::vector<std::string> errs(n);
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        sp_comm_config cfg{};
        cfg.struct_size = sizeof cfg;
        cfg.rank = r;
        cfg.world_size = n;
        cfg.timeout_ms = timeout_ms;
        cfg.store = store->abi();
        cfg.options = options;
        rcs[r] = api->create(&cfg, &comms[r]);
        if (rcs[r] != SP_OK) errs[r] = api->last_error();
      });
    for (auto& t : ts) t.join();
    for (int r = 0; r < n; ++r) EXPECT_EQ(rcs[r], SP_OK) << "rank " << r << ": " << errs[r];
  }
  ~Group() {
    for (auto* c : comms)
      if (c) api->destroy(c);
  }

  // Runs fn(rank) on one thread per rank.
  void each(const std::function<void(int)>& fn) {
    std::vector<std::thread> ts;
    for (int r = 0; r < static_cast<int>(comms.size()); ++r) ts.emplace_back(fn, r);
    for (auto& t : ts) t.join();
  }
};

struct Outcome {
  int status = -1;
  std::string error;
  Clock::duration took{};
};

// A blocking all_reduce of `count` floats on `comm`, on its own thread.
std::future<Outcome> all_reduce_async(const sp_comm_api* api, sp_comm* comm, size_t count = 1) {
  return std::async(std::launch::async, [api, comm, count] {
    std::vector<float> x(count, 1.0f);
    sp_buffer b = cpu(x.data(), count, SP_FLOAT32);
    auto t0 = Clock::now();
    Outcome o;
    o.status = api->all_reduce(comm, &b, &b, SP_SUM, nullptr);
    o.took = Clock::now() - t0;
    if (o.status != SP_OK) o.error = api->last_error();
    return o;
  });
}

// Same-host shared memory (the default here), and over TCP the pairwise
// all_reduce (plugins/comm_gloo/tcp_all_reduce.h) with one segment and with
// several in flight (4 MiB): each fails in one line, in bounded time.
struct Path {
  const char* const* options;
  size_t count;
};
const char* const kTcp[] = {"shm=off", nullptr};
const char* const kTcpRing[] = {"shm=off", "tcp_all_reduce=ring", nullptr};
const Path kPaths[] = {{nullptr, 1}, {kTcp, 1}, {kTcp, size_t(1) << 20}};

TEST(CommGloo, PeerThatNeverComesTimesOut) {
  for (const Path& p : kPaths) {
    Group g(2, 2000, p.options);
    auto f = all_reduce_async(g.api, g.comms[1], p.count);  // rank 0 never joins
    Outcome o = f.get();
    EXPECT_EQ(o.status, SP_ERR_TIMEOUT) << o.error;
    EXPECT_TRUE(contains(o.error, "all_reduce on rank 1 of 2")) << o.error;
    EXPECT_EQ(o.error.find('\n'), std::string::npos) << o.error;
    EXPECT_GT(o.took, 1s);
    EXPECT_LT(o.took, 15s);
  }
}

TEST(CommGloo, PeerThatVanishesFailsTheCollective) {
  for (const Path& p : kPaths) {
    Group g(2, 60000, p.options);
    float x = 1;
    sp_buffer b = cpu(&x, 1, SP_FLOAT32);
    g.each([&](int r) { ASSERT_EQ(g.api->barrier(g.comms[r], nullptr), SP_OK); });
    auto f = all_reduce_async(g.api, g.comms[1], p.count);
    std::this_thread::sleep_for(200ms);
    g.api->destroy(g.comms[0]);  // closes its sockets, as a dying process would
    g.comms[0] = nullptr;
    Outcome o = f.get();
    EXPECT_EQ(o.status, SP_ERR_INTERNAL) << o.error;
    EXPECT_TRUE(contains(o.error, "all_reduce on rank 1 of 2")) << o.error;
    EXPECT_EQ(o.error.find('\n'), std::string::npos) << o.error;
    EXPECT_LT(o.took, 30s);
    // The broken communicator keeps failing instead of hanging.
    EXPECT_NE(g.api->all_reduce(g.comms[1], &b, &b, SP_SUM, nullptr), SP_OK);
  }
}

TEST(CommGloo, AbortFailsPendingAndFutureWork) {
  Group g(2, 60000);
  auto f = all_reduce_async(g.api, g.comms[1]);  // blocks: rank 0 is not there
  float y[3] = {1, 2, 3};
  std::this_thread::sleep_for(200ms);
  ASSERT_EQ(g.api->abort(g.comms[1]), SP_OK);
  Outcome o = f.get();
  EXPECT_EQ(o.status, SP_ERR_ABORTED) << o.error;
  EXPECT_TRUE(contains(o.error, "all_reduce")) << o.error;
  EXPECT_LT(o.took, 10s);

  sp_buffer b = cpu(y, 3, SP_FLOAT32);
  EXPECT_EQ(g.api->all_reduce(g.comms[1], &b, &b, SP_SUM, nullptr), SP_ERR_ABORTED);
  sp_work* w = nullptr;
  EXPECT_EQ(g.api->barrier(g.comms[1], &w), SP_ERR_ABORTED);
  // The peer, reached through the closed connection, fails instead of waiting.
  auto t0 = Clock::now();
  EXPECT_NE(g.api->all_reduce(g.comms[0], &b, &b, SP_SUM, nullptr), SP_OK);
  EXPECT_LT(Clock::now() - t0, 30s);
}

TEST(CommGloo, AbortFailsQueuedAsyncWork) {
  Group g(2, 60000);
  std::vector<float> data(4, 1.0f);
  sp_buffer b = cpu(data.data(), 4, SP_FLOAT32);
  std::vector<sp_work*> works(3, nullptr);
  for (auto& w : works) ASSERT_EQ(g.api->all_reduce(g.comms[1], &b, &b, SP_SUM, &w), SP_OK);
  int32_t done = 1;
  EXPECT_EQ(g.api->test(works[0], &done), SP_OK);
  EXPECT_EQ(done, 0);
  EXPECT_EQ(g.api->wait(works[0], 100), SP_ERR_TIMEOUT);  // the work stays valid
  ASSERT_EQ(g.api->abort(g.comms[1]), SP_OK);
  for (auto* w : works) {
    EXPECT_EQ(g.api->wait(w, 20000), SP_ERR_ABORTED) << g.api->last_error();
    g.api->release(w);
  }
}

TEST(CommGloo, AbortReachesSplits) {
  Group g(2, 60000);
  std::vector<sp_comm*> subs(2, nullptr);
  g.each([&](int r) { ASSERT_EQ(g.api->split(g.comms[r], 0, r, &subs[r]), SP_OK); });
  ASSERT_NE(subs[1], nullptr);
  auto f = all_reduce_async(g.api, subs[1]);
  std::this_thread::sleep_for(200ms);
  ASSERT_EQ(g.api->abort(g.comms[1]), SP_OK);  // the parent
  Outcome o = f.get();
  EXPECT_EQ(o.status, SP_ERR_ABORTED) << o.error;
  EXPECT_LT(o.took, 10s);
  for (auto* s : subs) g.api->destroy(s);
}

TEST(CommGloo, BadArgumentsAreRefusedUpFront) {
  Group g(1, 10000);
  float x[4] = {};
  sp_buffer b4 = cpu(x, 4, SP_FLOAT32), b3 = cpu(x, 3, SP_FLOAT32), i4 = cpu(x, 4, SP_INT32);
  EXPECT_EQ(g.api->all_reduce(g.comms[0], &b4, &b3, SP_SUM, nullptr), SP_ERR_INVALID);
  EXPECT_TRUE(contains(g.api->last_error(), "all_reduce")) << g.api->last_error();
  EXPECT_EQ(g.api->all_reduce(g.comms[0], &b4, &i4, SP_SUM, nullptr), SP_ERR_INVALID);
  EXPECT_EQ(g.api->all_reduce(g.comms[0], &b4, &b4, 17, nullptr), SP_ERR_INVALID);
  EXPECT_EQ(g.api->broadcast(g.comms[0], &b4, &b4, 1, nullptr), SP_ERR_INVALID);
  EXPECT_EQ(g.api->send(g.comms[0], &b4, 3, 0, nullptr), SP_ERR_INVALID);
  sp_buffer cuda = b4;
  cuda.device_type = SP_DEVICE_CUDA;
  EXPECT_EQ(g.api->all_reduce(g.comms[0], &cuda, &cuda, SP_SUM, nullptr), SP_ERR_UNSUPPORTED);
}

// Half types are reduced in float and rounded to nearest, ties to even.
TEST(CommGloo, HalfPrecisionSumRoundsToNearestEven) {
  Group g(2, 30000);
  // bfloat16 keeps 7 fraction bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7
  // (goes to 1), 1 + 2^-7 + 2^-8 a tie between odd 1 + 2^-7 and 1 + 2^-6.
  const uint16_t bf_one = 0x3f80, bf_one_ulp = 0x3f81, bf_2m8 = 0x3b80, bf_one_2ulp = 0x3f82;
  // float16 keeps 10: the same with 2^-11 (0x1000) on 1 (0x3c00).
  const uint16_t h_one = 0x3c00, h_one_ulp = 0x3c01, h_2m11 = 0x1000, h_one_2ulp = 0x3c02;
  std::vector<std::vector<uint16_t>> bf(2), h(2);
  bf[0] = {bf_one, bf_one_ulp};
  bf[1] = {bf_2m8, bf_2m8};
  h[0] = {h_one, h_one_ulp};
  h[1] = {h_2m11, h_2m11};
  g.each([&](int r) {
    sp_buffer b = cpu(bf[r].data(), 2, SP_BFLOAT16), c = cpu(h[r].data(), 2, SP_FLOAT16);
    EXPECT_EQ(g.api->all_reduce(g.comms[r], &b, &b, SP_SUM, nullptr), SP_OK) << g.api->last_error();
    EXPECT_EQ(g.api->all_reduce(g.comms[r], &c, &c, SP_SUM, nullptr), SP_OK) << g.api->last_error();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(bf[r], (std::vector<uint16_t>{bf_one, bf_one_2ulp})) << "rank " << r;
    EXPECT_EQ(h[r], (std::vector<uint16_t>{h_one, h_one_2ulp})) << "rank " << r;
  }
}

// Raw use without the framework: two processes meet in a directory
// (file_store=). The child then exits without a word; the parent's next
// collective fails naming it instead of hanging.
TEST(CommGloo, FileStoreProcessesAndAPeerThatDies) {
  const sp_comm_api* api = gloo_api();
  auto dir = std::filesystem::temp_directory_path() / ("shardplan-test-gloo-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::string opt = "file_store=" + dir.string();
  const char* options[] = {opt.c_str(), "local_addr=127.0.0.1", nullptr};
  auto create = [&](int rank, sp_comm** out) {
    sp_comm_config cfg{};
    cfg.struct_size = sizeof cfg;
    cfg.rank = rank;
    cfg.world_size = 2;
    cfg.timeout_ms = 30000;
    cfg.options = options;
    return api->create(&cfg, out);
  };

  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    sp_comm* c = nullptr;
    int64_t v = 5;
    sp_buffer b = cpu(&v, 1, SP_INT64);
    bool ok = create(1, &c) == SP_OK && api->all_reduce(c, &b, &b, SP_SUM, nullptr) == SP_OK && v == 7;
    ::_exit(ok ? 0 : 3);  // no destroy: the kernel closes the sockets
  }
  sp_comm* c = nullptr;
  ASSERT_EQ(create(0, &c), SP_OK) << api->last_error();
  int64_t v = 2;
  sp_buffer b = cpu(&v, 1, SP_INT64);
  EXPECT_EQ(api->all_reduce(c, &b, &b, SP_SUM, nullptr), SP_OK) << api->last_error();
  EXPECT_EQ(v, 7);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;

  auto t0 = Clock::now();
  int st = api->all_reduce(c, &b, &b, SP_SUM, nullptr);
  std::string err = st == SP_OK ? "" : api->last_error();
  EXPECT_TRUE(st == SP_ERR_INTERNAL || st == SP_ERR_TIMEOUT) << st << " " << err;
  EXPECT_TRUE(contains(err, "all_reduce on rank 0 of 2")) << err;
  EXPECT_LT(Clock::now() - t0, 30s);
  api->destroy(c);
  std::filesystem::remove_all(dir);
}

}  // namespace

namespace {

// link_gbps=X holds each operation to the time its bytes need at X Gbit/s
// (plugins/comm_gloo/link.h); a lower bound only, which sleeping guarantees.
TEST(CommGloo, EmulatedLinkPacesOperationsAndSplitsInheritIt) {
  const char* options[] = {"link_gbps=0.08", nullptr};  // 10 MB/s
  Group g(2, 30000, options);
  const sp_comm_api* api = g.api;
  constexpr size_t kCount = 65536;  // 256 KiB of float32
  // all_reduce sends 2 (n-1)/n of the buffer: 262144 bytes, 26.2 ms.
  const auto at_least = std::chrono::microseconds(26214);
  std::vector<Clock::duration> took(2), took_async(2), took_split(2);
  std::vector<std::vector<float>> out(2);
  g.each([&](int r) {
    std::vector<float> x(kCount, static_cast<float>(r + 1));
    sp_buffer b = cpu(x.data(), kCount, SP_FLOAT32);
    auto t0 = Clock::now();
    ASSERT_EQ(api->all_reduce(g.comms[r], &b, &b, SP_SUM, nullptr), SP_OK) << api->last_error();
    took[r] = Clock::now() - t0;
    t0 = Clock::now();
    sp_work* w = nullptr;
    ASSERT_EQ(api->all_reduce(g.comms[r], &b, &b, SP_SUM, &w), SP_OK) << api->last_error();
    ASSERT_EQ(api->wait(w, -1), SP_OK) << api->last_error();
    api->release(w);
    took_async[r] = Clock::now() - t0;
    out[r] = x;
    sp_comm* child = nullptr;
    ASSERT_EQ(api->split(g.comms[r], 0, r, &child), SP_OK) << api->last_error();
    t0 = Clock::now();
    ASSERT_EQ(api->all_reduce(child, &b, &b, SP_SUM, nullptr), SP_OK) << api->last_error();
    took_split[r] = Clock::now() - t0;
    api->destroy(child);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_GE(took[r], at_least) << "rank " << r;
    EXPECT_GE(took_async[r], at_least) << "rank " << r;
    EXPECT_GE(took_split[r], at_least) << "rank " << r;
    EXPECT_EQ(out[r].front(), 6.0f);  // (1 + 2) twice
    EXPECT_EQ(out[r].back(), 6.0f);
  }
}

}  // namespace

// Over TCP two ranks exchange whole buffers instead of running gloo's ring
// (plugins/comm_gloo/tcp_all_reduce.h).
namespace {

size_t element_size(int32_t dtype) {
  switch (dtype) {
    case SP_FLOAT64: case SP_INT64: return 8;
    case SP_FLOAT16: case SP_BFLOAT16: return 2;
    case SP_INT8: case SP_UINT8: return 1;
    default: return 4;
  }
}

// One rank's input: mostly values in [-2, 2], with what makes the order of a
// reduction's operands show in its bits: -0 against +0, and for max/min NaNs
// of different payloads on the two ranks (they pick one operand). A sum or
// product of two NaNs is some NaN whose payload the CPU picks by the
// operands' order in the instruction, which the compiler chooses per loop
// (vectorized body or scalar tail): no order of the C++ operands fixes it,
// so there only one rank's element is a NaN.
std::vector<uint8_t> tricky_input(int32_t dtype, int32_t op, size_t count, int rank) {
  std::mt19937 gen(1234u + 77u * static_cast<unsigned>(rank) + static_cast<unsigned>(count));
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  const size_t es = element_size(dtype);
  std::vector<uint8_t> out(count * es);
  const bool is_float = dtype == SP_FLOAT32 || dtype == SP_FLOAT64 || dtype == SP_FLOAT16 || dtype == SP_BFLOAT16;
  for (size_t i = 0; i < count; ++i) {
    const float f = value(gen);
    uint64_t bits = gen();
    if (is_float) {
      const uint64_t sign = uint64_t(1) << (8 * es - 1);
      const uint64_t quiet_nan = dtype == SP_FLOAT32 ? 0x7fc00000u : dtype == SP_FLOAT64 ? 0x7ff8000000000000u
                                 : dtype == SP_FLOAT16 ? 0x7e00u : 0x7fc0u;
      double d = f;
      uint32_t fb;
      std::memcpy(&fb, &f, 4);
      std::memcpy(&bits, &d, 8);
      if (es == 4) bits = fb;
      if (es == 2) bits = dtype == SP_BFLOAT16 ? fb >> 16 : 0x3c00u ^ (gen() & 0x83ffu);
      if (i % 7 == 1) bits = rank ? sign : 0;                             // -0 / +0
      if (i % 7 == 3) bits = rank ? 0 : sign;                             // +0 / -0
      const bool nan_here = op == SP_MAX || op == SP_MIN ? i % 11 == 5 : i % 11 == 5 + static_cast<size_t>(rank);
      if (nan_here) bits = quiet_nan | (static_cast<uint64_t>(rank) + 1 + i % 3);  // payload by rank
    }
    std::memcpy(out.data() + i * es, &bits, es);
  }
  return out;
}

// Both ranks' results of one all_reduce of tricky_input, in place or out.
std::vector<std::vector<uint8_t>> reduced(Group& g, int32_t dtype, int32_t op, size_t count, bool in_place) {
  std::vector<std::vector<uint8_t>> out(2);
  g.each([&](int r) {
    std::vector<uint8_t> in = tricky_input(dtype, op, count, r);
    out[r].assign(in.size(), 0xee);
    sp_buffer s = cpu(in.data(), count, dtype), d = cpu(in_place ? in.data() : out[r].data(), count, dtype);
    ASSERT_EQ(g.api->all_reduce(g.comms[r], &s, &d, op, nullptr), SP_OK) << g.api->last_error();
    if (in_place) out[r] = in;
  });
  return out;
}

// The exchange gives gloo's ring's bits on both ranks: every dtype and op,
// 1 element, odd counts, counts around its 1 MiB segments (and gloo's ring's
// chunk boundary), and buffers of several MiB, in place and out.
TEST(CommGloo, TcpPairAllReduceIsGloosRingBitForBit) {
  Group pair(2, 60000, kTcp), ring(2, 60000, kTcpRing);
  struct Case { int32_t dtype; std::vector<int32_t> ops; std::vector<size_t> counts; };
  const std::vector<int32_t> all_ops = {SP_SUM, SP_PROD, SP_MIN, SP_MAX};
  const std::vector<Case> cases = {
      {SP_FLOAT32, all_ops, {1, 2, 3, 1001, 65537, 262143, 262144, 262145}},
      {SP_FLOAT32, {SP_SUM, SP_MAX}, {(size_t(5) << 20) / 4 + 3}},
      {SP_FLOAT64, all_ops, {1, 3, 1001, 131071, 131073}},
      {SP_FLOAT64, {SP_MIN}, {(size_t(6) << 20) / 8 + 1}},
      {SP_BFLOAT16, all_ops, {1, 3, 1001, 524287, 524289}},
      {SP_BFLOAT16, {SP_SUM}, {(size_t(5) << 20) / 2 + 1}},
      {SP_FLOAT16, all_ops, {1, 1001, 131073}},
      {SP_INT32, all_ops, {1, 3, 65537}},
      {SP_INT64, all_ops, {1, 32769}},
      {SP_INT8, all_ops, {1, 262145}},
  };
  for (const Case& c : cases)
    for (int32_t op : c.ops)
      for (size_t count : c.counts)
        for (bool in_place : {true, false}) {
          const auto mine = reduced(pair, c.dtype, op, count, in_place);
          const auto gloo = reduced(ring, c.dtype, op, count, in_place);
          const std::string what = "dtype " + std::to_string(c.dtype) + " op " + std::to_string(op) + " count " +
                                   std::to_string(count) + (in_place ? " in place" : " out of place");
          ASSERT_EQ(mine[0], gloo[0]) << what;
          ASSERT_EQ(mine[1], gloo[1]) << what;
          ASSERT_EQ(mine[0], mine[1]) << what;
        }
}

}  // namespace

}  // namespace test_comm_gloo
