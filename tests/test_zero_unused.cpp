// ZeRO-1 with parameters no rank uses (issue 33, item 8): one never used
// (`spare`), one that no rank uses every third step (`sometimes`). DDP with
// Adam leaves such a parameter alone: no update, no optimizer state, and a
// step count of its own (gradients set to none between steps, PyTorch's
// default). ZeRO-1 at 2 and 4 thread ranks, with one bucket and
// with many, must end every step with the parameters of one process running
// torch's Adam on the global batch (float64, 1e-12), across a checkpoint
// saved and loaded in the middle, and that checkpoint must hold the state
// torch's Adam holds (none for `spare`, fewer steps for `sometimes`), so a
// plain Adam in one process goes on from it alike.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "shardplan/checkpoint.h"
#include "shardplan/checkpoint_meta.h"
#include "shardplan/data_parallel.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"
#include "shardplan/zero_optimizer.h"

namespace test_zero_unused {

namespace {

namespace fs = std::filesystem;

struct SparseMlpImpl : torch::nn::Cloneable<SparseMlpImpl> {
  SparseMlpImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", shardplan::nn::Linear(5, 12));
    spare = register_module("spare", shardplan::nn::Linear(4, 4));
    sometimes = register_module("sometimes", shardplan::nn::Linear(3, 3));
    fc2 = register_module("fc2", shardplan::nn::Linear(12, 3));
  }
  // Step s (from 0) uses `sometimes` unless s % 3 == 2, on every rank alike.
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y, int s) {
    auto l = torch::mse_loss(fc2->forward(torch::tanh(fc1->forward(x))), y);
    if (s % 3 != 2) l = l + 0.1 * sometimes->forward(y).pow(2).mean();
    return l;
  }
  shardplan::nn::Linear fc1{nullptr}, spare{nullptr}, sometimes{nullptr}, fc2{nullptr};
};
TORCH_MODULE(SparseMlp);

constexpr int kSteps = 6, kSaveAfter = 3;

struct Data {
  SparseMlp initial{nullptr};
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;  // global, 8 samples
  std::vector<std::map<std::string, torch::Tensor>> after;       // one process's parameters after each step
};

std::unique_ptr<torch::optim::Adam> adam(const std::vector<torch::Tensor>& p) {
  return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2));
}

std::map<std::string, torch::Tensor> snapshot(torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

// Steps [from, to) of one process with torch's Adam on the global batch.
// Gradients set to none before each step (PyTorch's zero_grad() since 2.0,
// as ZeroOptimizer::zero_grad): libtorch 1.13's zero_grad() zeroes them
// instead, and Adam then moves a parameter a step did not use.
void train_one_process(const Data& d, SparseMlpImpl& m, torch::optim::Optimizer& opt, int from, int to,
                       std::vector<std::map<std::string, torch::Tensor>>* after) {
  for (int s = from; s < to; ++s) {
    for (auto& p : m.parameters()) p.mutable_grad() = torch::Tensor();
    m.loss(d.batches[s].first, d.batches[s].second, s).backward();
    opt.step();
    if (after) after->push_back(snapshot(m));
  }
}

const Data& data() {
  static const Data d = [] {
    Data d;
    torch::manual_seed(3);
    d.initial = SparseMlp();
    d.initial->to(torch::kDouble);
    for (int s = 0; s < kSteps; ++s)
      d.batches.emplace_back(torch::randn({8, 5}, torch::kDouble), torch::randn({8, 3}, torch::kDouble));
    auto m = std::dynamic_pointer_cast<SparseMlpImpl>(d.initial->clone());
    auto opt = adam(m->parameters());
    train_one_process(d, *m, *opt, 0, kSteps, &d.after);
    return d;
  }();
  return d;
}

void expect_params(torch::nn::Module& m, const std::map<std::string, torch::Tensor>& want, const std::string& where) {
  for (const auto& p : m.named_parameters()) {
    const double err = (p.value().detach() - want.at(p.key())).abs().max().item<double>();
    EXPECT_LT(err, 1e-12) << where << ": " << p.key();
  }
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void run_zero(int world, double bucket_mb) {
  const Data& d = data();
  const std::string name = std::to_string(world) + "_" + std::to_string(static_cast<int>(bucket_mb * 1e4));
  const fs::path dir = fs::temp_directory_path() / ("shardplan_zero_unused_" + name + "_" + std::to_string(::getpid()));
  const auto plan = shardplan::parse_plan("version: 1\nmesh: {data: " + std::to_string(world) +
                                              "}\ndata_parallel: {zero: true, bucket_mb: " +
                                              std::to_string(bucket_mb) + "}\nrules: []\n",
                                          "zero.yaml");
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    // Steps [from, to) under ZeRO-1 on a fresh replica, from the checkpoint when from > 0.
    auto run = [&](int from, int to) {
      auto model = std::dynamic_pointer_cast<SparseMlpImpl>(d.initial->clone());
      auto report = shardplan::parallelize(*model, plan, w);
      shardplan::DataParallel dp(*model, report, plan, w);
      shardplan::ZeroOptimizer zero(dp, [](std::vector<torch::Tensor> p) { return adam(p); });
      shardplan::CheckpointOptions o;
      o.zero = &zero;
      if (from > 0) shardplan::load_checkpoint(dir.string(), *model, report, w, o);
      for (int s = from; s < to; ++s) {
        zero.zero_grad();
        model->loss(dp.local_batch(d.batches[s].first), dp.local_batch(d.batches[s].second), s).backward();
        zero.step();
        expect_params(*model, d.after[s], "rank " + std::to_string(w.rank()) + " step " + std::to_string(s + 1));
      }
      if (from == 0) shardplan::save_checkpoint(dir.string(), *model, report, w, o);
    };
    run(0, kSaveAfter);
    run(kSaveAfter, kSteps);
  });

  // What torch's Adam holds after step 3: no state for `spare`, 2 steps for
  // `sometimes` (unused in step 3), 3 for the others.
  const auto meta = shardplan::ckpt::parse_meta(read_text(dir / "metadata.yaml"), "metadata.yaml");
  EXPECT_EQ(meta.find("optimizer/spare.weight/exp_avg"), nullptr);
  EXPECT_EQ(meta.attributes.count("optimizer/spare.bias/step"), 0u);
  EXPECT_NE(meta.find("optimizer/sometimes.weight/exp_avg"), nullptr);
  EXPECT_EQ(meta.attributes.at("optimizer/sometimes.weight/step"), "2");
  EXPECT_EQ(meta.attributes.at("optimizer/fc1.weight/step"), "3");

  // One process with a plain Adam goes on from it as it would from its own.
  shardplan::run_ranks_in_threads(1, [&](shardplan::World& w) {
    auto model = std::dynamic_pointer_cast<SparseMlpImpl>(d.initial->clone());
    auto opt = adam(model->parameters());
    shardplan::CheckpointOptions o;
    o.optimizer = opt.get();
    shardplan::load_checkpoint(dir.string(), *model, shardplan::ParallelReport{}, w, o);
    std::vector<std::map<std::string, torch::Tensor>> after;
    train_one_process(d, *model, *opt, kSaveAfter, kSteps, &after);
    expect_params(*model, d.after.back(), "one process from the ZeRO checkpoint");
  });
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace

TEST(ZeroUnused, ReferenceLeavesSpareAlone) {
  const Data& d = data();
  EXPECT_TRUE(torch::equal(d.after.back().at("spare.weight"), d.initial->spare->weight));
  EXPECT_FALSE(torch::equal(d.after[1].at("sometimes.weight"), d.after[0].at("sometimes.weight")));
  EXPECT_TRUE(torch::equal(d.after[2].at("sometimes.weight"), d.after[1].at("sometimes.weight")));
}

TEST(ZeroUnused, AdamAtTwoRanksOneBucketEqualsOneProcess) { run_zero(2, 25); }
TEST(ZeroUnused, AdamAtTwoRanksManyBucketsEqualsOneProcess) { run_zero(2, 0.0005); }
TEST(ZeroUnused, AdamAtFourRanksManyBucketsEqualsOneProcess) { run_zero(4, 0.0005); }

}  // namespace test_zero_unused
