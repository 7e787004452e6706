// The torchshard-style helpers (shardplan/helpers.h): slicing, shard
// initialisation equal to initialise-then-slice, and parallel dims.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "shardplan/error.h"
#include "shardplan/helpers.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace test_helpers {

namespace {

using shardplan::ShardSplit;

TEST(Helpers, SliceTakesTheRanksPartUnevenSizesIncluded) {
  auto full = torch::arange(40, torch::kDouble).view({10, 4});
  const std::vector<int64_t> sizes = {3, 3, 3, 1};
  int64_t row = 0;
  for (int64_t r = 0; r < 4; ++r) {
    auto part = shardplan::slice(full, 0, 4, r);
    ASSERT_EQ(part.size(0), sizes[static_cast<size_t>(r)]);
    EXPECT_TRUE(part.equal(full.narrow(0, row, part.size(0))));
    row += part.size(0);
  }
  // Its own memory: freeing or changing the full tensor leaves it alone.
  auto part = shardplan::slice(full, -1, 2, 1);
  EXPECT_TRUE(part.is_contiguous());
  full.zero_();
  EXPECT_EQ(part[0][0].item<double>(), 2.0);
  // Stacked blocks (fused q/k/v) are each cut alike.
  auto qkv = torch::arange(12, torch::kDouble);
  EXPECT_TRUE(shardplan::slice(qkv, 0, 2, 1, 3).equal(torch::tensor({2.0, 3.0, 6.0, 7.0, 10.0, 11.0}, torch::kDouble)));
  EXPECT_THROW(shardplan::slice(qkv, 1, 2, 0), shardplan::Error);
  EXPECT_THROW(shardplan::slice(qkv, 0, 2, 2), shardplan::Error);
}

TEST(Helpers, SliceByGroupUsesTheGroupsRankAndSize) {
  auto full = torch::randn({6, 5}, torch::kDouble);
  std::vector<torch::Tensor> parts(3);
  shardplan::run_ranks_in_threads(3, [&](shardplan::World& world) {
    parts[static_cast<size_t>(world.rank())] = shardplan::slice(full, 1, world.comm());
  });
  EXPECT_TRUE(torch::cat(parts, 1).equal(full));
  EXPECT_EQ(parts[2].size(1), 1);
}

// Every sharding of one counter-based initialiser puts the same full tensor
// together, bit for bit, for dims 0 and 1, blocks, uneven parts and dtypes.
TEST(Helpers, CounterInitShardsConcatenateToTheFullTensor) {
  const std::vector<int64_t> shape = {12, 7, 3};
  for (auto init : {shardplan::normal_init(7, 0.5, 2.0), shardplan::uniform_init(9, -1.0, 3.0)}) {
    for (auto dtype : {torch::kDouble, torch::kFloat}) {
      auto whole = torch::empty(shape, dtype);
      shardplan::shard_init_(whole, shape, ShardSplit{}, init);
      for (int64_t dim : {0, 1})
        for (int64_t blocks : {int64_t{1}, int64_t{3}})
          for (int64_t parts : {1, 2, 3, 4}) {
            if (dim == 1 && blocks == 3) continue;  // 7 is not 3 blocks
            std::vector<torch::Tensor> pieces;
            for (int64_t r = 0; r < parts; ++r) {
              auto expect = shardplan::slice(whole, dim, parts, r, blocks);
              auto piece = torch::full(expect.sizes(), -99.0, dtype);
              shardplan::shard_init_(piece, shape, ShardSplit{dim, "model", parts, r, blocks}, init);
              EXPECT_TRUE(piece.equal(expect)) << "dim " << dim << " blocks " << blocks << " part " << r << "/" << parts;
            }
          }
    }
  }
}

TEST(Helpers, CounterInitHasTheRequestedDistribution) {
  auto t = torch::empty({200, 500}, torch::kDouble);
  shardplan::shard_init_(t, {200, 500}, ShardSplit{}, shardplan::normal_init(1, 0.5, 2.0));
  EXPECT_NEAR(t.mean().item<double>(), 0.5, 0.03);
  EXPECT_NEAR(t.std().item<double>(), 2.0, 0.03);
  auto u = torch::empty({200, 500}, torch::kDouble);
  shardplan::shard_init_(u, {200, 500}, ShardSplit{}, shardplan::uniform_init(1, -1.0, 3.0));
  EXPECT_GE(u.min().item<double>(), -1.0);
  EXPECT_LE(u.max().item<double>(), 3.0);
  EXPECT_NEAR(u.mean().item<double>(), 1.0, 0.03);
  // Another seed, other numbers.
  auto v = torch::empty({200, 500}, torch::kDouble);
  shardplan::shard_init_(v, {200, 500}, ShardSplit{}, shardplan::normal_init(2, 0.5, 2.0));
  EXPECT_LT(std::abs(torch::corrcoef(torch::stack({t.flatten(), v.flatten()}))[0][1].item<double>()), 0.02);
}

// The fan of kaiming/xavier comes from the full shape, not the shard's.
TEST(Helpers, FanBasedBoundsUseTheFullShape) {
  const std::vector<int64_t> shape = {64, 32};
  auto k = shardplan::kaiming_uniform_init(3, shape);
  const double bound = 1.0 / std::sqrt(32.0);  // torch::nn::Linear's weight bound
  EXPECT_NEAR(k.b, bound, 1e-15);
  EXPECT_NEAR(k.a, -bound, 1e-15);
  auto x = shardplan::xavier_uniform_init(3, shape);
  EXPECT_NEAR(x.b, std::sqrt(6.0 / 96.0), 1e-15);
  auto piece = torch::empty({64, 16}, torch::kDouble);
  shardplan::shard_init_(piece, shape, ShardSplit{1, "model", 2, 1, 1}, k);
  EXPECT_LE(piece.abs().max().item<double>(), bound);
  EXPECT_GT(piece.abs().max().item<double>(), 0.9 * bound);
  EXPECT_THROW(shardplan::kaiming_uniform_init(3, {5}), shardplan::Error);
}

// Any torch initialiser: the shard equals initialising the full tensor with
// the same generator state and slicing it.
TEST(Helpers, TorchInitShardEqualsInitThenSlice) {
  const std::vector<int64_t> shape = {10, 6};
  torch::manual_seed(42);
  auto full = torch::empty(shape, torch::kDouble);
  torch::nn::init::kaiming_uniform_(full, std::sqrt(5.0));
  for (int64_t r = 0; r < 4; ++r) {
    torch::manual_seed(42);
    auto piece = torch::empty({r < 3 ? 3 : 1, 6}, torch::kDouble);
    shardplan::shard_init_(piece, shape, ShardSplit{0, "model", 4, r, 1},
                           [](torch::Tensor& t) { torch::nn::init::kaiming_uniform_(t, std::sqrt(5.0)); });
    EXPECT_TRUE(piece.equal(shardplan::slice(full, 0, 4, r)));
  }
  auto wrong = torch::empty({4, 6}, torch::kDouble);
  try {
    shardplan::shard_init_(wrong, shape, ShardSplit{0, "model", 4, 0, 1}, shardplan::normal_init(1, 0, 1));
    FAIL() << "a shard of the wrong shape was filled";
  } catch (const shardplan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("has shape [3, 6]"), std::string::npos) << e.what();
  }
}

TEST(Helpers, DeclaredParallelDimLivesWithItsTensor) {
  auto w = torch::zeros({4, 4});
  EXPECT_FALSE(shardplan::get_parallel_dim(w).has_value());
  shardplan::register_parallel_dim(w, -1);
  ASSERT_TRUE(shardplan::get_parallel_dim(w).has_value());
  EXPECT_EQ(*shardplan::get_parallel_dim(w), 1);
  EXPECT_EQ(shardplan::get_parallel_split(w)->axis, "model");
  auto alias = w;  // the same tensor
  EXPECT_EQ(*shardplan::get_parallel_dim(alias), 1);
  EXPECT_FALSE(shardplan::get_parallel_dim(w.clone()).has_value());
  shardplan::register_parallel_dim(w, 0, "data");
  EXPECT_EQ(*shardplan::get_parallel_dim(w), 0);
  EXPECT_THROW(shardplan::register_parallel_dim(w, 2), shardplan::Error);
  // A tensor made after w is gone knows nothing, even at w's address.
  w = torch::Tensor();
  alias = torch::Tensor();
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(shardplan::get_parallel_dim(torch::zeros({4, 4})).has_value());
}

struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl() {
    fc1 = register_module("fc1", shardplan::nn::Linear(8, 6));
    fc2 = register_module("fc2", shardplan::nn::Linear(6, 4));
  }
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TwoLayer);

TEST(Helpers, PlanCutsAreReadableAsParallelDims) {
  auto plan = shardplan::parse_plan(
      "mesh: {model: auto}\nrules:\n"
      "  - {match: 'fc1\\.weight', layout: [model, null], output: sharded}\n"
      "  - {match: 'fc1\\.bias', layout: [model]}\n"
      "  - {match: 'fc2\\.weight', layout: [null, model], input: sharded}\n");
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& world) {
    TwoLayer m;
    auto report = shardplan::parallelize(*m, plan, world);
    EXPECT_EQ(shardplan::get_parallel_dim(m->fc1->weight), 0);
    EXPECT_EQ(shardplan::get_parallel_dim(m->fc1->bias), 0);
    EXPECT_EQ(shardplan::get_parallel_dim(m->fc2->weight), 1);
    EXPECT_FALSE(shardplan::get_parallel_dim(m->fc2->bias).has_value());
    EXPECT_EQ(shardplan::get_parallel_split(m->fc1->weight)->index, world.rank());
    EXPECT_EQ(shardplan::get_parallel_split(m->fc1->weight)->parts, 2);
    EXPECT_EQ(shardplan::get_parallel_dim(report, "fc2.weight"), 1);
    EXPECT_FALSE(shardplan::get_parallel_dim(report, "fc2.bias").has_value());
    EXPECT_THROW(shardplan::get_parallel_dim(report, "fc3.weight"), shardplan::Error);
  });
}

// The point of shard_init_: a model sharded by hand starts from the weights
// the unsharded model has for the same seed, without the full weight.
TEST(Helpers, HandShardedLayerStartsFromTheUnshardedWeights) {
  const std::vector<int64_t> shape = {6, 8};
  auto init = shardplan::kaiming_uniform_init(11, shape);
  auto full = torch::empty(shape, torch::kDouble);
  shardplan::shard_init_(full, shape, ShardSplit{}, init);
  auto x = torch::randn({5, 8}, torch::kDouble);
  auto expect = torch::matmul(x, full.t());
  std::vector<torch::Tensor> outs(2);
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& world) {
    const int64_t r = world.rank();
    auto w = torch::empty({3, 8}, torch::kDouble);
    shardplan::shard_init_(w, shape, ShardSplit{0, "model", 2, r, 1}, init);
    shardplan::register_parallel_split(w, ShardSplit{0, "model", 2, r, 1});
    outs[static_cast<size_t>(r)] = torch::matmul(x, w.t());
  });
  EXPECT_TRUE(torch::cat(outs, 1).allclose(expect, 1e-15, 1e-15));
}

}  // namespace

}  // namespace test_helpers
