// Pipeline::stats(): the figures the benchmarks read, exact where the
// schedule decides them. A Sequential of equal Linear layers, one per
// stage (two per rank interleaved), so every activation and gradient that
// crosses a stage boundary has the same A bytes: the bytes sent and
// received are A x micro-batches per boundary and direction, the chunks in
// flight at most are what the schedule's simulation says (GPipe m, 1F1B
// p - stage), and the activation bytes kept are those chunks' inputs and
// outputs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shardplan/pipeline.h"
#include "shardplan/pipeline_schedule.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace test_pipeline_stats {

namespace {

using namespace shardplan;

constexpr int64_t kRows = 24, kWidth = 8;

struct Case {
  std::string schedule;
  int pipe = 2, micro = 4, virt = 1;
};

// Every rank's stats after each of two steps.
std::vector<std::vector<PipelineStats>> run(const Case& c) {
  const std::string plan_text = "version: 1\nmesh: {pipe: " + std::to_string(c.pipe) + "}\npipeline: {schedule: " +
                                c.schedule + ", micro_batches: " + std::to_string(c.micro) +
                                (c.virt > 1 ? ", virtual_stages: " + std::to_string(c.virt) : std::string()) +
                                ", stages: auto}\nrules: []\n";
  const Plan plan = parse_plan(plan_text, "p.yaml");
  torch::manual_seed(3);
  torch::nn::Sequential seq;
  for (int i = 0; i < c.pipe * c.virt; ++i) seq->push_back(torch::nn::Linear(kWidth, kWidth));
  seq->to(torch::kDouble);
  const at::Tensor x = torch::randn({kRows, kWidth}, torch::kDouble), y = torch::randn({kRows, kWidth}, torch::kDouble);
  std::vector<std::vector<PipelineStats>> out(c.pipe);
  std::mutex mu;
  run_ranks_in_threads(c.pipe, [&](World& world) {
    torch::nn::Sequential mine(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(seq->clone()));
    SequentialPipeline pieces(mine);
    Pipeline pipe(*mine, pieces, plan, world);
    std::vector<PipelineStats> steps;
    for (int i = 0; i < 2; ++i) {
      pipe.step(x, y, [](const at::Tensor& o, const at::Tensor& t) { return torch::mse_loss(o, t); });
      steps.push_back(pipe.stats());
    }
    std::lock_guard<std::mutex> lock(mu);
    out[pipe.stage()] = steps;
  });
  return out;
}

void expect_exact(const Case& c) {
  SCOPED_TRACE(c.schedule + " p " + std::to_string(c.pipe) + " m " + std::to_string(c.micro));
  const int64_t a = kRows / c.micro * kWidth * 8;  // one micro-batch's activation (and gradient), float64
  const int model_stages = c.pipe * c.virt;
  const auto sim = simulate_schedule(pipeline_schedule(c.schedule, c.pipe, c.micro, c.virt));
  const auto all = run(c);
  for (int s = 0; s < c.pipe; ++s) {
    // Per chunk: an activation out unless it is the model's last stage, a
    // gradient back unless the first.
    int64_t boundaries = 0;
    for (int k = s; k < model_stages; k += c.pipe) boundaries += (k < model_stages - 1) + (k > 0);
    for (const PipelineStats& st : all[s]) {
      SCOPED_TRACE("stage " + std::to_string(s));
      EXPECT_EQ(st.bytes_sent, boundaries * c.micro * a);
      EXPECT_EQ(st.bytes_received, boundaries * c.micro * a);
      EXPECT_EQ(st.peak_in_flight, sim.peak_in_flight[s]);
      if (c.schedule == "gpipe") EXPECT_EQ(st.peak_in_flight, c.micro);
      if (c.schedule == "1f1b") EXPECT_EQ(st.peak_in_flight, c.pipe - s);
      // Uninterleaved, an input of A bytes past stage 0 and an output of A.
      if (c.virt == 1) EXPECT_EQ(st.peak_activation_bytes, st.peak_in_flight * (s == 0 ? 1 : 2) * a);
      EXPECT_GT(st.forward_s, 0);
      EXPECT_GT(st.backward_s, 0);
      EXPECT_GE(st.wait_s, 0);
      // Disjoint parts of the step.
      EXPECT_GE(st.step_s, st.compute_s() + st.wait_s);
    }
  }
}

}  // namespace

TEST(PipelineStats, GpipeKeepsEveryMicroBatchInFlight) {
  expect_exact({"gpipe", 2, 4});
  expect_exact({"gpipe", 4, 6});
}

TEST(PipelineStats, OneFOneBKeepsAtMostTheStagesLeft) {
  expect_exact({"1f1b", 2, 4});
  expect_exact({"1f1b", 4, 6});
  expect_exact({"1f1b", 4, 4});
}

TEST(PipelineStats, InterleavedSendsPerChunk) { expect_exact({"interleaved", 2, 4, 2}); }

}  // namespace test_pipeline_stats
