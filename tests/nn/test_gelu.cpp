// shardplan::gelu against at::gelu: the same values and input gradients bit
// for bit, on runs of every length modulo ATen's vector turn, on values where
// Sleef's and libm's erf/exp disagree, and on the special values; the cases
// it leaves to at::gelu; the refused second derivative.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "shardplan/nn/gelu.h"

namespace test_gelu {

namespace {

// Equal bit for bit, NaNs alike.
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const at::Tensor ca = a.contiguous().to(at::kDouble), cb = b.contiguous().to(at::kDouble);
  const double* pa = ca.data_ptr<double>();
  const double* pb = cb.data_ptr<double>();
  for (int64_t i = 0; i < ca.numel(); ++i) {
    if (std::isnan(pa[i]) && std::isnan(pb[i])) continue;
    if (pa[i] != pb[i] || std::signbit(pa[i]) != std::signbit(pb[i])) return false;
  }
  return true;
}

struct Result {
  at::Tensor y, dx;
};

Result run(const at::Tensor& x, const at::Tensor& dy, bool ours) {
  at::Tensor leaf = x.detach().clone().requires_grad_(true);
  at::Tensor y = ours ? shardplan::gelu(leaf) : at::gelu(leaf);
  y.backward(dy);
  return {y.detach(), leaf.grad()};
}

// Intra-op threads for one test, restored after.
class OneThread {
 public:
  explicit OneThread(int n = 1) : before_(at::get_num_threads()) { at::set_num_threads(n); }
  ~OneThread() { at::set_num_threads(before_); }

 private:
  int before_;
};

}  // namespace

TEST(Gelu, ThisLibtorchPassesTheProbe) {
  // Debian's libtorch 1.13 is the one described in gelu.h; if its kernels
  // change, the fast path switches itself off and this says so.
  EXPECT_TRUE(shardplan::testing::gelu_fast_path_available());
}

TEST(Gelu, ValueAndGradientAreAtGelusBitForBit) {
  OneThread one;
  torch::manual_seed(5);
  for (int64_t n : {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 23, 100, 1023, 4103, 16384, 65541, 262144}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const at::Tensor x = at::randn({n}, at::kDouble) * 3, dy = at::randn({n}, at::kDouble);
    ASSERT_TRUE(shardplan::testing::gelu_takes_fast_path(x.clone().requires_grad_(true)));
    const Result ours = run(x, dy, true), torch_ = run(x, dy, false);
    EXPECT_TRUE(same_bits(ours.y, torch_.y));
    EXPECT_TRUE(same_bits(ours.dx, torch_.dx));
  }
}

TEST(Gelu, ShapesSpecialValuesAndTheTailsWhereSleefAndLibmDiffer) {
  OneThread one;
  // Values where erf(x/sqrt 2) or exp(-x*x/2) from Sleef and libm differ,
  // placed at every position of a run's scalar end.
  const at::Tensor c = at::linspace(-6.0, 6.0, 20011, at::kDouble);
  const at::Tensor erf = (c * M_SQRT1_2).erf();
  std::vector<double> differ;
  for (int64_t i = 0; i < c.numel(); ++i) {
    const double v = c[i].item<double>();
    if (erf[i].item<double>() != std::erf(v * M_SQRT1_2)) differ.push_back(v);
  }
  ASSERT_GT(differ.size(), 16u) << "this machine's Sleef and libm agree: the test would not tell the paths apart";
  const std::vector<double> special = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1e-310, -1e-310, 40.0, -40.0, 1e300};
  for (int64_t n : {8 + 7, 64 + 3, 1000 + 5}) {
    at::Tensor x = at::empty({n}, at::kDouble);
    for (int64_t i = 0; i < n; ++i)
      x[i] = i < static_cast<int64_t>(special.size()) ? special[i] : differ[static_cast<size_t>(i) % differ.size()];
    const at::Tensor dy = at::randn({n}, at::kDouble);
    const Result ours = run(x, dy, true), torch_ = run(x, dy, false);
    EXPECT_TRUE(same_bits(ours.y, torch_.y)) << n;
    EXPECT_TRUE(same_bits(ours.dx, torch_.dx)) << n;
  }
  // Any shape: a contiguous [B, T, H] as an MLP gives it.
  const at::Tensor x = at::randn({4, 16, 96}, at::kDouble), dy = at::randn({4, 16, 96}, at::kDouble);
  const Result ours = run(x, dy, true), torch_ = run(x, dy, false);
  EXPECT_TRUE(same_bits(ours.y, torch_.y));
  EXPECT_TRUE(same_bits(ours.dx, torch_.dx));
}

TEST(Gelu, WhatItLeavesToAtGelu) {
  using shardplan::testing::gelu_takes_fast_path;
  OneThread one;
  const at::Tensor x = at::randn({64, 32}, at::kDouble);
  EXPECT_FALSE(gelu_takes_fast_path(x));  // no gradient wanted
  EXPECT_FALSE(gelu_takes_fast_path(x.to(at::kFloat).requires_grad_(true)));
  EXPECT_FALSE(gelu_takes_fast_path(x.t().requires_grad_(true)));  // not contiguous
  {
    at::NoGradGuard no_grad;
    EXPECT_FALSE(gelu_takes_fast_path(x.clone().requires_grad_(true)));
  }
  {
    // Several intra-op threads: ATen splits a large run between them.
    OneThread two(2);
    EXPECT_TRUE(gelu_takes_fast_path(x.clone().requires_grad_(true)));  // 2048 elements: one run
    EXPECT_FALSE(gelu_takes_fast_path(at::randn({20000}, at::kDouble).requires_grad_(true)));
  }
  // The cases it leaves still give at::gelu's numbers.
  for (const at::Tensor& t : {x.to(at::kFloat), x.t(), at::randn({20000}, at::kDouble)}) {
    OneThread two(2);
    const at::Tensor dy = at::randn_like(t);
    const Result ours = run(t, dy, true), torch_ = run(t, dy, false);
    EXPECT_TRUE(same_bits(ours.y, torch_.y));
    EXPECT_TRUE(same_bits(ours.dx, torch_.dx));
  }
  at::NoGradGuard no_grad;
  EXPECT_TRUE(same_bits(shardplan::gelu(x), at::gelu(x)));
}

TEST(Gelu, SecondDerivativesAreRefused) {
  OneThread one;
  const at::Tensor x = at::randn({10}, at::kDouble).requires_grad_(true);
  const at::Tensor y = shardplan::gelu(x).sum();
  try {
    torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
    FAIL() << "create_graph through shardplan::gelu did not throw";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("shardplan::gelu: no second derivative"), std::string::npos) << e.what();
  }
  // A first derivative through the same graph still works.
  const at::Tensor g = torch::autograd::grad({y}, {x})[0];
  EXPECT_TRUE(same_bits(g, at::gelu_backward(at::ones_like(x), x.detach())));
}

}  // namespace test_gelu
