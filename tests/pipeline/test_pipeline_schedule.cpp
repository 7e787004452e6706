// Pipeline schedules as pure functions: every stage's list runs without a
// deadlock against the others, each micro-batch's forward precedes its
// backward on every stage, sends pair with receives, 1F1B keeps at most p
// micro-batches in flight (GPipe m), and the simulated bubble is the
// predicted (p-1)/(m+p-1). And the simulator catches the schedules it must refuse.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "shardplan/error.h"
#include "shardplan/pipeline_schedule.h"

namespace test_pipeline_schedule {

namespace {

using namespace shardplan;

struct Shape {
  int p, m, v;
};
const Shape kShapes[] = {{1, 1, 1}, {1, 4, 1}, {2, 2, 1}, {2, 4, 1}, {2, 7, 1}, {3, 5, 1}, {4, 4, 1}, {4, 8, 1}, {8, 16, 1}};
const Shape kInterleaved[] = {{2, 2, 2}, {2, 4, 2}, {2, 4, 3}, {4, 4, 2}, {4, 8, 2}, {3, 6, 4}};

int position(const std::vector<PipelineAction>& list, PipelineOp op, int micro, int chunk) {
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].op == op && list[i].micro == micro && list[i].chunk == chunk) return static_cast<int>(i);
  return -1;
}

// Independent of the simulator: on every stage each micro-batch chunk is
// forwarded once, then backwarded once; and the k-th send on a channel
// names the micro-batch of the k-th receive there.
void expect_well_formed(const PipelineSchedule& s, int m, int v) {
  std::map<std::tuple<int, int, bool>, std::vector<int>> sent, received;
  for (size_t r = 0; r < s.size(); ++r) {
    int forwards = 0, backwards = 0;
    for (const PipelineAction& a : s[r]) {
      forwards += a.op == PipelineOp::forward;
      backwards += a.op == PipelineOp::backward;
      const bool grad = a.op == PipelineOp::send_gradient || a.op == PipelineOp::recv_gradient;
      if (a.op == PipelineOp::send_activation || a.op == PipelineOp::send_gradient)
        sent[{static_cast<int>(r), a.peer, grad}].push_back(a.micro);
      if (a.op == PipelineOp::recv_activation || a.op == PipelineOp::recv_gradient)
        received[{a.peer, static_cast<int>(r), grad}].push_back(a.micro);
    }
    EXPECT_EQ(forwards, m * v) << "stage " << r;
    EXPECT_EQ(backwards, m * v) << "stage " << r;
    for (int mb = 0; mb < m; ++mb)
      for (int c = 0; c < v; ++c) {
        const int f = position(s[r], PipelineOp::forward, mb, c), b = position(s[r], PipelineOp::backward, mb, c);
        EXPECT_GE(f, 0);
        EXPECT_LT(f, b) << "stage " << r << " micro-batch " << mb << " chunk " << c;
      }
  }
  EXPECT_EQ(sent, received);
}

}  // namespace

TEST(PipelineSchedule, GpipeAndOneFOneBAreWellFormedAndRunWithoutDeadlock) {
  for (const char* kind : {"gpipe", "1f1b"})
    for (const Shape& sh : kShapes) {
      SCOPED_TRACE(std::string(kind) + " p=" + std::to_string(sh.p) + " m=" + std::to_string(sh.m));
      const PipelineSchedule s = pipeline_schedule(kind, sh.p, sh.m);
      ASSERT_EQ(s.size(), static_cast<size_t>(sh.p));
      expect_well_formed(s, sh.m, 1);
      EXPECT_NO_THROW(simulate_schedule(s));
    }
}

TEST(PipelineSchedule, TheFirstAndLastStagesNeitherReceiveNorSendPastTheEnds) {
  const PipelineSchedule s = pipeline_schedule("1f1b", 4, 4);
  for (const PipelineAction& a : s[0])
    EXPECT_TRUE(a.op != PipelineOp::recv_activation && a.op != PipelineOp::send_gradient) << to_string(a);
  for (const PipelineAction& a : s[3])
    EXPECT_TRUE(a.op != PipelineOp::send_activation && a.op != PipelineOp::recv_gradient) << to_string(a);
  // Stage 1 of 4: two forwards of warm-up, then one forward and one backward.
  std::vector<std::string> computes;
  for (const PipelineAction& a : s[1])
    if (a.op == PipelineOp::forward || a.op == PipelineOp::backward) computes.push_back(to_string(a));
  EXPECT_EQ(computes, (std::vector<std::string>{"F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"}));
}

TEST(PipelineSchedule, OneFOneBKeepsAtMostTheStagesInFlightGpipeAll) {
  for (const Shape& sh : kShapes) {
    SCOPED_TRACE("p=" + std::to_string(sh.p) + " m=" + std::to_string(sh.m));
    const ScheduleSimulation one = simulate_schedule(pipeline_schedule("1f1b", sh.p, sh.m));
    const ScheduleSimulation all = simulate_schedule(pipeline_schedule("gpipe", sh.p, sh.m));
    for (int r = 0; r < sh.p; ++r) {
      EXPECT_EQ(one.peak_in_flight[r], std::min(sh.p - r, sh.m)) << "stage " << r;
      EXPECT_LE(one.peak_in_flight[r], sh.p);
      EXPECT_EQ(all.peak_in_flight[r], sh.m) << "stage " << r;
    }
  }
}

TEST(PipelineSchedule, SimulatedBubbleIsThePredictedOne) {
  for (const char* kind : {"gpipe", "1f1b"})
    for (const Shape& sh : kShapes)
      for (double backward : {1.0, 2.0}) {
        SCOPED_TRACE(std::string(kind) + " p=" + std::to_string(sh.p) + " m=" + std::to_string(sh.m));
        const ScheduleSimulation sim = simulate_schedule(pipeline_schedule(kind, sh.p, sh.m), 1, backward);
        const double predicted = pipeline_bubble(kind, sh.p, sh.m);
        EXPECT_NEAR(predicted, (sh.p - 1.0) / (sh.m + sh.p - 1.0), 1e-15);
        EXPECT_NEAR(sim.bubble(), predicted, 1e-12);
        EXPECT_NEAR(sim.makespan, (sh.m + sh.p - 1) * (1 + backward), 1e-12);
      }
}

TEST(PipelineSchedule, InterleavedRunsWithoutDeadlockAndShrinksTheBubble) {
  for (const Shape& sh : kInterleaved) {
    SCOPED_TRACE("p=" + std::to_string(sh.p) + " m=" + std::to_string(sh.m) + " v=" + std::to_string(sh.v));
    const PipelineSchedule s = pipeline_schedule("interleaved", sh.p, sh.m, sh.v);
    expect_well_formed(s, sh.m, sh.v);
    // Each chunk is 1/v of the stage: the same work as 1F1B's.
    const ScheduleSimulation sim = simulate_schedule(s, 1.0 / sh.v, 2.0 / sh.v);
    const ScheduleSimulation plain = simulate_schedule(pipeline_schedule("1f1b", sh.p, sh.m), 1, 2);
    EXPECT_LT(sim.bubble(), plain.bubble() + 1e-12);
    EXPECT_NEAR(sim.bubble(), pipeline_bubble("interleaved", sh.p, sh.m, sh.v), 1e-12);
  }
}

TEST(PipelineSchedule, SimulatorRefusesBrokenSchedules) {
  auto error_of = [](const PipelineSchedule& s) {
    try {
      simulate_schedule(s);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  using Op = PipelineOp;
  // Both stages receive before they send.
  PipelineSchedule dead = {{{Op::recv_gradient, 0, 0, 1}, {Op::forward, 0, 0, -1}},
                           {{Op::recv_activation, 0, 0, 0}, {Op::forward, 0, 0, -1}}};
  EXPECT_NE(error_of(dead).find("deadlocks: stage 0 at recv_grad 0 from 1, stage 1 at recv_act 0 from 0"),
            std::string::npos)
      << error_of(dead);
  // One stage running F0, B1, B0, F1: B1 before its forward.
  PipelineSchedule early = pipeline_schedule("gpipe", 1, 2);
  std::swap(early[0][1], early[0][3]);
  EXPECT_NE(error_of(early).find("comes before its forward"), std::string::npos) << error_of(early);
  // The receiver expects micro-batch 1 where 0 was sent first.
  PipelineSchedule swapped = pipeline_schedule("gpipe", 2, 2);
  for (PipelineAction& a : swapped[1])
    if (a.op == Op::recv_activation) a.micro = 1 - a.micro;
  EXPECT_NE(error_of(swapped).find("receives micro-batch 0"), std::string::npos) << error_of(swapped);
  // A send nobody receives.
  PipelineSchedule lost = pipeline_schedule("1f1b", 1, 1);
  lost[0].push_back({Op::send_activation, 0, 0, 0});
  EXPECT_NE(error_of(lost).find("never receives it"), std::string::npos) << error_of(lost);
  EXPECT_THROW(pipeline_schedule("zb", 2, 2), Error);
  EXPECT_THROW(pipeline_schedule("interleaved", 2, 3, 2), Error);
  EXPECT_THROW(pipeline_schedule("1f1b", 2, 4, 2), Error);
  EXPECT_THROW(pipeline_schedule("gpipe", 0, 4), Error);
}

}  // namespace test_pipeline_schedule
