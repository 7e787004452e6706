// `stages: {auto: time}`: the plan's form and its errors, a cut that
// balances pieces equal in parameters but not in cost (where `auto` by
// parameters cuts elsewhere), the same cut on every rank (their chunks tile
// the model), and a timed run still equal to one process (float64, 1e-10).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shardplan/error.h"
#include "shardplan/pipeline.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace test_pipeline_timing {

namespace {

using namespace shardplan;

constexpr int64_t kWidth = 64, kRows = 64;

// One Linear applied `times` times: the parameters of one, the cost of many.
struct RepeatImpl : torch::nn::Cloneable<RepeatImpl> {
  RepeatImpl(int64_t width, int times) : width(width), times(times) { reset(); }
  void reset() override { lin = register_module("lin", torch::nn::Linear(width, width)); }
  at::Tensor forward(at::Tensor x) {
    for (int i = 0; i < times; ++i) x = torch::tanh(lin(x));
    return x;
  }
  int64_t width;
  int times;
  torch::nn::Linear lin{nullptr};
};
TORCH_MODULE(Repeat);

torch::nn::Sequential model_of(const std::vector<int>& repeats) {
  torch::manual_seed(4);
  torch::nn::Sequential seq;
  for (int r : repeats) seq->push_back(Repeat(kWidth, r));
  seq->to(torch::kDouble);
  return seq;
}

std::string plan_of(int pipe, const std::string& stages) {
  return "version: 1\nmesh: {pipe: " + std::to_string(pipe) + "}\npipeline: {schedule: gpipe, micro_batches: 2, "
         "stages: " + stages + "}\nrules: []\n";
}

struct Cut {
  std::vector<StageRanges> chunks;  // per stage
  double loss = 0;
  std::map<std::string, at::Tensor> grads;
};

Cut run(const torch::nn::Sequential& seq, int pipe, const std::string& stages, const at::Tensor& x, const at::Tensor& y) {
  const Plan plan = parse_plan(plan_of(pipe, stages), "p.yaml");
  Cut out;
  out.chunks.resize(pipe);
  std::mutex mu;
  run_ranks_in_threads(pipe, [&](World& world) {
    torch::nn::Sequential mine(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(seq->clone()));
    SequentialPipeline pieces(mine);
    Pipeline p(*mine, pieces, plan, world, nullptr, x);
    const double loss = p.step(x, y, [](const at::Tensor& o, const at::Tensor& t) { return torch::mse_loss(o, t); });
    std::lock_guard<std::mutex> lock(mu);
    out.chunks[p.stage()] = p.chunks();
    out.loss = loss;
    for (const auto& [name, t] : p.named_parameters()) out.grads[name] = t.grad().clone();
  });
  return out;
}

// Stage s's pieces begin where stage s - 1's end, from 0 to n.
void expect_tiles(const Cut& r, size_t n) {
  size_t next = 0;
  for (const StageRanges& c : r.chunks) {
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].first, next);
    next = c[0].second;
  }
  EXPECT_EQ(next, n);
}

std::string error_of(const std::string& stages) {
  try {
    parse_plan(plan_of(2, stages), "p.yaml");
  } catch (const PlanError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(PipelineTiming, PlanForms) {
  EXPECT_EQ(parse_plan(plan_of(2, "{auto: time}"), "p.yaml").pipeline.balance, "time");
  EXPECT_EQ(parse_plan(plan_of(2, "{auto: params}"), "p.yaml").pipeline.balance, "params");
  EXPECT_EQ(parse_plan(plan_of(2, "auto"), "p.yaml").pipeline.balance, "params");
  const Plan timed = parse_plan(plan_of(2, "{auto: time}"), "p.yaml");
  EXPECT_NE(timed.to_yaml().find("stages: {auto: time}"), std::string::npos) << timed.to_yaml();
  EXPECT_EQ(parse_plan(timed.to_yaml(), "q.yaml").pipeline.balance, "time");
  EXPECT_EQ(error_of("{auto: speed}"), "p.yaml:3:62: pipeline.stages: {auto: ...} balances by params or time");
  EXPECT_NE(error_of("{auto: time, by: 2}").find("p.yaml:3:55: pipeline.stages must be auto, {auto: time} or"),
            std::string::npos);
}

// Piece 0 costs 12 of the others' and has their parameters: by parameters
// the cut is 3 + 3 pieces (cost 14 : 3), by time piece 0 alone (12 : 5).
TEST(PipelineTiming, BalancesCostNotParameters) {
  const torch::nn::Sequential seq = model_of({12, 1, 1, 1, 1, 1});
  torch::manual_seed(6);
  const at::Tensor x = torch::randn({kRows, kWidth}, torch::kDouble), y = torch::randn({kRows, kWidth}, torch::kDouble);
  const Cut by_params = run(seq, 2, "auto", x, y), by_time = run(seq, 2, "{auto: time}", x, y);
  expect_tiles(by_params, 6);
  expect_tiles(by_time, 6);
  EXPECT_EQ(by_params.chunks[0][0].second, 3u);
  EXPECT_EQ(by_time.chunks[0][0].second, 1u);
  // 4 ranks: the costly piece alone, the other five shared by three.
  const Cut four = run(seq, 4, "{auto: time}", x, y);
  expect_tiles(four, 6);
  EXPECT_EQ(four.chunks[0][0].second, 1u);
}

// The timing runs no backward and draws no dropout: the step is the one
// process's step.
TEST(PipelineTiming, TimedCutMatchesOneProcess) {
  const torch::nn::Sequential seq = model_of({6, 1, 2, 1});
  torch::manual_seed(6);
  const at::Tensor x = torch::randn({kRows, kWidth}, torch::kDouble), y = torch::randn({kRows, kWidth}, torch::kDouble);
  torch::nn::Sequential ref(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(seq->clone()));
  const at::Tensor loss = torch::mse_loss(ref->forward(x), y);
  loss.backward();
  const Cut got = run(seq, 2, "{auto: time}", x, y);
  EXPECT_NEAR(got.loss, loss.item<double>(), 1e-10);
  ASSERT_EQ(got.grads.size(), ref->named_parameters().size());
  for (const auto& p : ref->named_parameters())
    EXPECT_LT((got.grads.at(p.key()) - p.value().grad()).abs().max().item<double>(), 1e-10) << p.key();
}

TEST(PipelineTiming, NeedsASample) {
  const Plan plan = parse_plan(plan_of(2, "{auto: time}"), "p.yaml");
  const torch::nn::Sequential seq = model_of({1, 1});
  try {
    run_ranks_in_threads(2, [&](World& world) {
      torch::nn::Sequential mine(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(seq->clone()));
      SequentialPipeline pieces(mine);
      Pipeline p(*mine, pieces, plan, world);
    });
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("stages: {auto: time} times each piece's forward on a sample batch"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace test_pipeline_timing
