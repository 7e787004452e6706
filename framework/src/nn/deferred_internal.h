#pragma once
// What load_weights needs of deferred initialisation beyond the public API
// (shardplan/nn/deferred_init.h). Not installed.
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace shardplan {
namespace nn {
namespace detail {

// Gives every parameter still over the zero page memory of its own, in place;
// zeroed or not (a caller that writes every element need not pay for zeros).
std::vector<std::string> give_memory(torch::nn::Module& model, bool zero);

// `t` holds real values now: forward may use it.
void mark_filled(const at::Tensor& t);

// Whether `t`'s storage is still the zero page (no memory of its own).
bool over_zero_page(const at::Tensor& t);
// A tensor of `sizes` over the zero page: what a deferred parameter's TP
// shard becomes (replace_parameter), so that a rank gives its shard memory
// only when it loads it, and under ZeRO-3 only its slice of it ever.
at::Tensor zero_page_like(at::IntArrayRef sizes, at::ScalarType dtype);
// Puts `p` (a parameter this rank will never compute with: another pipeline
// stage's) back over the zero page in place, keeping its shape and dtype, so
// that its memory is freed and forward refuses it as a deferred parameter.
void release_to_zero_page(at::Tensor& p);

}  // namespace detail
}  // namespace nn
}  // namespace shardplan
