#include "shardplan/nn/gelu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "shardplan/error.h"

namespace shardplan {
namespace gelu_detail {

// ATen's constants (Activation.cpp, GeluKernelImpl and GeluBackwardKernelImpl),
// folded in the same order.
constexpr double kAlpha = M_SQRT1_2;
constexpr double kBeta = M_2_SQRTPI * M_SQRT1_2 * 0.5;
// ATen's vectorized loop takes two vectors of four doubles per turn and
// finishes a run with its scalar code (libm's erf and exp, not Sleef's, and
// no fused multiply-add).
constexpr int64_t kVectorTurn = 8;
// Up to this many elements ATen's GELU kernels run on one thread whatever
// the intra-op threads; beyond it they split the run between threads, and
// each thread's run has its own scalar end.
constexpr int64_t kOneRunUpTo = 16384;

// Over erf(x*alpha)'s storage y, over exp((x*x)*-0.5)'s the slope gelu'(x),
// each element with the roundings of ATen's vector lanes: y = (x*0.5) *
// (1 + erf), gelu'(x) = fma(x, beta*exp, 0.5*(1 + erf)) (its compiler
// contracted cdf + x*pdf there).
inline __attribute__((always_inline)) void combine_vector_lanes(const double* __restrict x,
                                                                double* __restrict erf_then_y,
                                                                double* __restrict exp_then_slope, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double e = 1.0 + erf_then_y[i];
    const double slope = std::fma(x[i], kBeta * exp_then_slope[i], 0.5 * e);
    erf_then_y[i] = (x[i] * 0.5) * e;
    exp_then_slope[i] = slope;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// With the instruction std::fma is one vfmadd; without it, a libm call per element.
__attribute__((target("avx2,fma"))) void combine_vector_lanes_fma(const double* x, double* erf_then_y,
                                                                 double* exp_then_slope, int64_t n) {
  combine_vector_lanes(x, erf_then_y, exp_then_slope, n);
}
#endif

// A run's scalar end as ATen's scalar code rounds it: libm's erf and exp, and
// cdf + x*pdf as a product and a sum (not contracted there); so no
// contraction here either, whatever -march a build uses.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
void scalar_end(const double* x, double* y, double* slope, int64_t begin, int64_t end) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  for (int64_t i = begin; i < end; ++i) {
    const double e = 1.0 + std::erf(x[i] * kAlpha);
    const double pdf = kBeta * std::exp((x[i] * x[i]) * -0.5);
    y[i] = (x[i] * 0.5) * e;
    slope[i] = 0.5 * e + x[i] * pdf;
  }
}

void combine(const double* x, double* erf_then_y, double* exp_then_slope, int64_t n) {
  const int64_t lanes = n - n % kVectorTurn;
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (has_fma)
    combine_vector_lanes_fma(x, erf_then_y, exp_then_slope, lanes);
  else
    combine_vector_lanes(x, erf_then_y, exp_then_slope, lanes);
#else
  combine_vector_lanes(x, erf_then_y, exp_then_slope, lanes);
#endif
  scalar_end(x, erf_then_y, exp_then_slope, lanes, n);
}

// GELU's value and slope at every element of a contiguous float64 x that
// ATen would compute as one run.
std::pair<at::Tensor, at::Tensor> values_and_slopes(const at::Tensor& x) {
  // at::erf and at::exp go through ATen's vml map, which uses Sleef's
  // vectors even for a run's last elements (padded); GELU's kernel uses libm
  // there, so combine() computes those again.
  at::Tensor y = at::mul(x, kAlpha);
  y.erf_();
  at::Tensor slope = at::mul(x, x);
  slope.mul_(-0.5);
  slope.exp_();
  combine(x.data_ptr<double>(), y.data_ptr<double>(), slope.data_ptr<double>(), x.numel());
  return {y, slope};
}

class GeluKeepingSlope : public torch::autograd::Function<GeluKeepingSlope> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    auto out = values_and_slopes(x);
    ctx->save_for_backward({out.second});
    return out.first;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // The slope is a constant here: its own derivative would be silently missing.
    if (at::GradMode::is_enabled())
      throw Error("shardplan::gelu: no second derivative (create_graph through it); it keeps gelu'(x), not x: "
                  "use at::gelu where second derivatives are needed");
    return {grads[0] * ctx->get_saved_variables()[0]};
  }
};

// Equal bit for bit, NaNs of any payload alike.
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  const double* pa = a.data_ptr<double>();
  const double* pb = b.data_ptr<double>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::isnan(pa[i]) && std::isnan(pb[i])) continue;
    if (pa[i] != pb[i] || std::signbit(pa[i]) != std::signbit(pb[i])) return false;
  }
  return true;
}

// Inputs where Sleef's and libm's erf(x*alpha) or exp((x*x)*-0.5) differ, so
// that an element computed by the other one than ATen's would show; then
// zeros of both signs, infinities, NaN, subnormals and tails.
std::vector<double> probe_values() {
  const at::Tensor c = at::linspace(-6.0, 6.0, 20011, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor erf = at::mul(c, kAlpha).erf_(), ex = at::mul(c, c).mul_(-0.5).exp_();
  const double* pc = c.data_ptr<double>();
  const double* pe = erf.data_ptr<double>();
  const double* px = ex.data_ptr<double>();
  std::vector<double> out = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1e-310, -1e-310, 40.0, -40.0, 1e300, -1e300};
  for (int64_t i = 0; i < c.numel() && out.size() < 1024; ++i)
    if (pe[i] != std::erf(pc[i] * kAlpha) || px[i] != std::exp((pc[i] * pc[i]) * -0.5)) out.push_back(pc[i]);
  return out;
}

// Whether this libtorch's GELU kernels round as values_and_slopes does, on
// runs of every length modulo the vector turn.
bool probe() {
  at::NoGradGuard no_grad;
  const std::vector<double> values = probe_values();
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(8), int64_t(13), int64_t(1021), int64_t(1024), int64_t(1031)}) {
    at::Tensor x = at::empty({n}, f64), dy = at::empty({n}, f64);
    for (int64_t i = 0; i < n; ++i) {
      // Each position kind (vector lane, scalar end) gets values that tell
      // Sleef and libm apart; dy keeps each product exact-ish but varied.
      x.data_ptr<double>()[i] = values[(static_cast<size_t>(i) * 7 + static_cast<size_t>(n)) % values.size()];
      dy.data_ptr<double>()[i] = 1.0 + 0.001 * static_cast<double>(i % 97) - 0.05 * static_cast<double>(i % 3);
    }
    const auto ours = values_and_slopes(x);
    if (!same_bits(ours.first, at::gelu(x))) return false;
    if (!same_bits(at::mul(dy, ours.second), at::gelu_backward(dy, x))) return false;
  }
  return true;
}

bool probe_passed() {
  static std::once_flag once;
  static bool passed = false;
  std::call_once(once, [] { passed = probe(); });
  return passed;
}

bool reaches(const at::Tensor& x) {
  return x.defined() && x.scalar_type() == at::kDouble && x.device().is_cpu() && x.layout() == at::kStrided &&
         x.is_contiguous() && x.numel() > 0 && x.requires_grad() && at::GradMode::is_enabled() &&
         (at::get_num_threads() == 1 || x.numel() <= kOneRunUpTo);
}

}  // namespace gelu_detail

at::Tensor gelu(const at::Tensor& x) {
  if (!testing::gelu_takes_fast_path(x)) return at::gelu(x);
  return gelu_detail::GeluKeepingSlope::apply(x);
}

namespace testing {
bool gelu_fast_path_available() { return gelu_detail::probe_passed(); }
bool gelu_takes_fast_path(const at::Tensor& x) { return gelu_detail::reaches(x) && gelu_detail::probe_passed(); }
}  // namespace testing

}  // namespace shardplan
