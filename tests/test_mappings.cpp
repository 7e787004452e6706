// The autograd conjugate pairs: forward results and gradients against the
// math they implement, with rank-dependent data, at world sizes 2, 3 and 4.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>

#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/mappings.h"
#include "shardplan/world.h"

namespace test_mappings {

namespace {

using shardplan::Communicator;
using shardplan::World;

// Deterministic per-rank data; every rank can compute every other rank's.
torch::Tensor data(int rank, std::vector<int64_t> shape, int salt = 0) {
  auto n = torch::arange(1, 1 + std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>()),
                         torch::kDouble);
  return (n * 0.5 + rank * 10 + salt).view(shape);
}

class Mappings : public ::testing::TestWithParam<int> {
 protected:
  void run(const std::function<void(World&)>& fn) {
    std::mutex mu;
    std::vector<std::string> errors;
    shardplan::run_ranks_in_threads(GetParam(), fn);
  }
};

#define EXPECT_TENSOR_EQ(a, b) EXPECT_TRUE(torch::allclose((a), (b), 0, 1e-12)) << (a) << "\nvs\n" << (b)

TEST_P(Mappings, CopyToGroupAllReducesGradients) {
  const int n = GetParam();
  run([&](World& w) {
    auto x = data(0, {2, 3}).requires_grad_(true);
    auto y = shardplan::copy_to_group(x, w.comm());
    EXPECT_TENSOR_EQ(y, x);
    (y * data(w.rank(), {2, 3}, 1)).sum().backward();
    auto expected = torch::zeros({2, 3}, torch::kDouble);
    for (int r = 0; r < n; ++r) expected += data(r, {2, 3}, 1);
    EXPECT_TENSOR_EQ(x.grad(), expected);
  });
}

TEST_P(Mappings, ReduceFromGroupSumsForwardAndPassesGradients) {
  const int n = GetParam();
  run([&](World& w) {
    auto x = data(w.rank(), {4}).requires_grad_(true);
    auto y = shardplan::reduce_from_group(x, w.comm());
    auto expected = torch::zeros({4}, torch::kDouble);
    for (int r = 0; r < n; ++r) expected += data(r, {4});
    EXPECT_TENSOR_EQ(y, expected);
    EXPECT_TENSOR_EQ(x, data(w.rank(), {4}));  // the input is not reduced in place
    (y * data(0, {4}, 2)).sum().backward();
    EXPECT_TENSOR_EQ(x.grad(), data(0, {4}, 2));
  });
}

TEST_P(Mappings, ScatterAndGatherAreTransposes) {
  const int n = GetParam();
  run([&](World& w) {
    const int r = w.rank();
    for (int64_t dim : {0, 1, -1}) {
      auto full = data(0, {2 * n, 3 * n}).requires_grad_(true);
      auto mine = shardplan::scatter_to_group(full, w.comm(), dim);
      EXPECT_TENSOR_EQ(mine, full.chunk(n, dim)[r]);
      (mine * data(r, mine.sizes().vec(), 3)).sum().backward();
      // d/dfull: each rank's upstream gradient lands in its own chunk.
      std::vector<torch::Tensor> parts;
      for (int q = 0; q < n; ++q) parts.push_back(data(q, mine.sizes().vec(), 3));
      EXPECT_TENSOR_EQ(full.grad(), torch::cat(parts, dim));

      auto piece = data(r, {2, 3}).requires_grad_(true);
      auto gathered = shardplan::gather_from_group(piece, w.comm(), dim);
      std::vector<torch::Tensor> all;
      for (int q = 0; q < n; ++q) all.push_back(data(q, {2, 3}));
      EXPECT_TENSOR_EQ(gathered, torch::cat(all, dim));
      auto g = data(0, gathered.sizes().vec(), 4);
      (gathered * g).sum().backward();
      EXPECT_TENSOR_EQ(piece.grad(), g.chunk(n, dim)[r]);
    }
  });
}

TEST_P(Mappings, ReduceScatterAndAllGatherAreTransposes) {
  const int n = GetParam();
  run([&](World& w) {
    const int r = w.rank();
    for (int64_t dim : {0, 1}) {
      std::vector<int64_t> shape = dim == 0 ? std::vector<int64_t>{2 * n, 3} : std::vector<int64_t>{2, 3 * n};
      auto x = data(r, shape).requires_grad_(true);
      auto y = shardplan::reduce_scatter_to_group(x, w.comm(), dim);
      auto sum = torch::zeros(shape, torch::kDouble);
      for (int q = 0; q < n; ++q) sum += data(q, shape);
      EXPECT_TENSOR_EQ(y, sum.chunk(n, dim)[r]);
      (y * data(r, y.sizes().vec(), 5)).sum().backward();
      std::vector<torch::Tensor> parts;
      for (int q = 0; q < n; ++q) parts.push_back(data(q, y.sizes().vec(), 5));
      EXPECT_TENSOR_EQ(x.grad(), torch::cat(parts, dim));

      auto piece = data(r, {2, 3}).requires_grad_(true);
      auto gathered = shardplan::all_gather_from_group(piece, w.comm(), dim);
      std::vector<torch::Tensor> all;
      for (int q = 0; q < n; ++q) all.push_back(data(q, {2, 3}));
      EXPECT_TENSOR_EQ(gathered, torch::cat(all, dim));
      (gathered * data(r, gathered.sizes().vec(), 6)).sum().backward();
      auto gsum = torch::zeros(gathered.sizes(), torch::kDouble);
      for (int q = 0; q < n; ++q) gsum += data(q, gathered.sizes().vec(), 6);
      EXPECT_TENSOR_EQ(piece.grad(), gsum.chunk(n, dim)[r]);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Mappings, ::testing::Values(2, 3, 4));

TEST(Mappings, GroupOfOneIsFreeAndIdentity) {
  shardplan::run_ranks_in_threads(1, [](World& w) {
    auto x = torch::randn({3, 4}, torch::requires_grad());
    EXPECT_TRUE(shardplan::copy_to_group(x, w.comm()).is_same(x));
    EXPECT_TRUE(shardplan::reduce_from_group(x, w.comm()).is_same(x));
    EXPECT_TRUE(shardplan::gather_from_group(x, w.comm()).is_same(x));
    EXPECT_TRUE(shardplan::scatter_to_group(x, w.comm()).is_same(x));
    EXPECT_EQ(w.total_stats().bytes, 0u);
  });
}

// ---------------------------------------------------------------- Communicator

TEST(Communicator, TensorCollectivesAlongAnyDim) {
  const int n = 3;
  shardplan::run_ranks_in_threads(n, [&](World& w) {
    Communicator& c = w.comm();
    const int r = w.rank();
    auto x = data(r, {2, 3, 4});
    std::vector<torch::Tensor> all;
    for (int q = 0; q < n; ++q) all.push_back(data(q, {2, 3, 4}));
    for (int64_t dim : {0, 1, 2}) EXPECT_TENSOR_EQ(c.all_gather(x, dim), torch::cat(all, dim));

    auto big = data(r, {n, 2, 2 * n});
    auto sum = torch::zeros({n, 2, 2 * n}, torch::kDouble);
    for (int q = 0; q < n; ++q) sum += data(q, {n, 2, 2 * n});
    EXPECT_TENSOR_EQ(c.reduce_scatter(big, 0), sum.chunk(n, 0)[r]);
    EXPECT_TENSOR_EQ(c.reduce_scatter(big, 2), sum.chunk(n, 2)[r]);

    auto m = data(r, {5});
    c.all_reduce(m, shardplan::ReduceOp::Max);
    EXPECT_TENSOR_EQ(m, data(n - 1, {5}));

    auto b = data(r, {2, 2});
    c.broadcast(b, 1);
    EXPECT_TENSOR_EQ(b, data(1, {2, 2}));

    auto s = c.scatter(r == 2 ? data(7, {n, 4}) : torch::Tensor(torch::empty({0}, torch::kDouble)), 2, {4});
    EXPECT_TENSOR_EQ(s, data(7, {n, 4})[r]);

    auto g = c.gather(data(r, {1, 3}), 0);
    if (r == 0) {
      std::vector<torch::Tensor> rows;
      for (int q = 0; q < n; ++q) rows.push_back(data(q, {1, 3}));
      EXPECT_TENSOR_EQ(g, torch::cat(rows, 0));
    } else {
      EXPECT_FALSE(g.defined());
    }

    // all_to_all: block j of rank q's input lands as block q on rank j.
    auto a2a = c.all_to_all(data(r, {n, 2}));
    for (int q = 0; q < n; ++q) EXPECT_TENSOR_EQ(a2a[q], data(q, {n, 2})[r]);

    // Ring of point-to-point messages.
    c.send(data(r, {3}), (r + 1) % n, 7);
    auto in = torch::empty({3}, torch::kDouble);
    c.recv(in, (r + n - 1) % n, 7);
    EXPECT_TENSOR_EQ(in, data((r + n - 1) % n, {3}));

    auto t = data(r, {1000});
    auto work = c.all_reduce_async(t);
    work->wait();
    auto total = torch::zeros({1000}, torch::kDouble);
    for (int q = 0; q < n; ++q) total += data(q, {1000});
    EXPECT_TENSOR_EQ(t, total);
    c.barrier();
  });
}

TEST(Communicator, CountsPayloadBytes) {
  shardplan::run_ranks_in_threads(2, [](World& w) {
    w.reset_stats();
    auto x = torch::ones({10}, torch::kFloat);
    w.comm().all_reduce(x);
    w.comm().all_gather(torch::ones({3}, torch::kDouble));
    EXPECT_EQ(w.comm().stats().calls, 2u);
    EXPECT_EQ(w.comm().stats().bytes, 10u * 4 + 3u * 8);
  });
}

TEST(Communicator, ErrorsNameCollectiveAndGroup) {
  shardplan::run_ranks_in_threads(2, [](World& w) {
    auto x = torch::ones({3, 5});
    try {
      w.comm().reduce_scatter(x, 1);
      ADD_FAILURE() << "reduce_scatter of 5 over 2 ranks succeeded";
    } catch (const shardplan::Error& e) {
      EXPECT_NE(std::string(e.what()).find("reduce_scatter on group 'world'"), std::string::npos) << e.what();
    }
    auto c = torch::ones({2}, torch::kComplexDouble);
    EXPECT_THROW(w.comm().all_reduce(c), shardplan::Error);
  });
}

}  // namespace

}  // namespace test_mappings
