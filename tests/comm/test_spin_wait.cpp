// A wait on an operation of a backend's worker (shardplan/comm_worker.h)
// that polls before it sleeps (InOrderQueue::set_spin_wait, the gloo
// plugin's spin_us=): it still returns the operation's own status and
// message, sees results the worker wrote, keeps the caller's timeout, and
// ends when the operation outlasts the poll (the wait then sleeps).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "shardplan/comm_worker.h"

namespace test_spin_wait {

namespace {

using shardplan::comm::InOrderQueue;
using shardplan::comm::OpInfo;
using Queue = InOrderQueue<std::function<int()>>;
using std::chrono::microseconds;
using std::chrono::milliseconds;

const OpInfo kInfo{"test", "op", 0, 2, milliseconds(60000)};

std::unique_ptr<Queue> make_queue(microseconds spin) {
  auto q = std::make_unique<Queue>([](std::function<int()>& run, std::string& err) {
    const int rc = run();
    if (rc != SP_OK) err = "it failed on purpose";
    return rc;
  });
  q->set_blocking_inline(false);  // as gloo: blocking calls go through the worker too
  q->set_spin_wait(spin);
  return q;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST(SpinWait, BlockingCallSeesTheWorkersResultAndStatus) {
  for (long spin : {0L, 200L, 1000000L}) {
    auto q = make_queue(microseconds(spin));
    std::vector<int> out(1000, 0);
    for (int round = 1; round <= 50; ++round) {
      const int rc = q->submit(kInfo, [&out, round] {
        for (int& x : out) x = round;
        return SP_OK;
      }, nullptr);
      ASSERT_EQ(rc, SP_OK) << "spin " << spin;
      ASSERT_EQ(out.front(), round);
      ASSERT_EQ(out.back(), round);
    }
    shardplan::comm::last_error().clear();
    EXPECT_EQ(q->submit(kInfo, [] { return SP_ERR_INTERNAL; }, nullptr), SP_ERR_INTERNAL);
    EXPECT_EQ(shardplan::comm::last_error(), "test op on rank 0 of 2: it failed on purpose");
  }
}

TEST(SpinWait, AsyncWaitReturnsWhenTheOperationEndsDuringThePoll) {
  auto q = make_queue(microseconds(1000000));
  std::atomic<bool> go{false};
  int value = 0;
  sp_work* work = nullptr;
  ASSERT_EQ(q->submit(kInfo, [&] {
    while (!go.load()) std::this_thread::yield();
    value = 7;
    return SP_OK;
  }, &work), SP_OK);
  std::thread release([&] {
    std::this_thread::sleep_for(milliseconds(20));
    go = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(shardplan::comm::wait_work("test", work, -1, "the test"), SP_OK);
  // Well within the 1 s poll: the wait ended with the operation, not the poll.
  EXPECT_LT(seconds_since(t0), 0.5);
  EXPECT_EQ(value, 7);
  release.join();
  shardplan::comm::release_work(work);
}

TEST(SpinWait, AWaitsTimeoutBoundsThePoll) {
  auto q = make_queue(microseconds(1000000));
  std::atomic<bool> go{false};
  sp_work* work = nullptr;
  ASSERT_EQ(q->submit(kInfo, [&] {
    while (!go.load()) std::this_thread::sleep_for(milliseconds(1));
    return SP_OK;
  }, &work), SP_OK);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(shardplan::comm::wait_work("test", work, 30, "the test"), SP_ERR_TIMEOUT);
  EXPECT_LT(seconds_since(t0), 0.5);  // 30 ms asked, not the 1 s poll
  EXPECT_NE(shardplan::comm::last_error().find("not finished after 30 ms"), std::string::npos)
      << shardplan::comm::last_error();
  go = true;
  EXPECT_EQ(shardplan::comm::wait_work("test", work, -1, "the test"), SP_OK);
  shardplan::comm::release_work(work);
}

TEST(SpinWait, AnOperationLongerThanThePollStillEnds) {
  auto q = make_queue(microseconds(2000));
  std::atomic<bool> go{false};
  std::thread release([&] {
    std::this_thread::sleep_for(milliseconds(50));
    go = true;
  });
  EXPECT_EQ(q->submit(kInfo, [&] {
    while (!go.load()) std::this_thread::sleep_for(milliseconds(1));
    return SP_OK;
  }, nullptr), SP_OK);
  EXPECT_TRUE(go.load());
  release.join();
}

}  // namespace test_spin_wait
