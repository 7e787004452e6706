#pragma once
// shardplan::gelu: at::gelu (the exact, erf form), bit for bit in value and
// gradient, that computes erf once per element and step instead of twice.
//
// at::gelu keeps its input and its backward evaluates erf and exp again; in
// float64 on a CPU, Sleef's erf costs ~40 multiplies per element, so GELU was
// a fifth of the example GPT's step. This forward also forms gelu'(x) from the
// same erf and keeps that instead of x (as many bytes as torch keeps), and the
// backward is one multiply. Every rounding is torch's own: where its kernel
// uses vectors, Sleef's erf and exp and its fused multiply-add in gelu'(x);
// where it finishes a run one element at a time, libm's and a plain product
// and sum. (torch's backward takes its scalar path everywhere when the
// incoming gradient is laid out unlike x; this one does not, so there the two
// may differ in the last bit. A Linear after the GELU gives a contiguous one.)
//
// A one-time probe against at::gelu and at::gelu_backward (values where Sleef
// and libm disagree, at every position kind) decides whether this libtorch's
// kernels are the ones described; if not, and outside the fast path's reach
// (not float64, not a contiguous CPU tensor, no gradient wanted, more than one
// intra-op thread on a tensor torch would split between threads), this is
// at::gelu itself. Second derivatives (create_graph through it) are refused
// with an error: use at::gelu there.
#include <ATen/core/Tensor.h>

namespace shardplan {

at::Tensor gelu(const at::Tensor& x);

namespace testing {
// Whether this process' libtorch passed the probe (the fast path is in use
// where it reaches).
bool gelu_fast_path_available();
// Whether shardplan::gelu would take the fast path for x now.
bool gelu_takes_fast_path(const at::Tensor& x);
}  // namespace testing

}  // namespace shardplan
