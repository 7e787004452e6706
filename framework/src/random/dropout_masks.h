#pragma once
// The recording and replay behind shardplan::DropoutMaskScope, for dropout()
// (random.cpp).
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "shardplan/random.h"

namespace shardplan {
namespace detail {

// The masks of the innermost DropoutMaskScope on this thread and its mode,
// or null outside any.
DropoutMasks* active_dropout_masks(DropoutMaskScope::Mode* mode);

// Keeps `noise` (just drawn: 0 or 1 per element, contiguous, on the CPU) and
// the state `gen` was left in.
void record_dropout_mask(DropoutMasks& masks, const at::Tensor& noise, double p, at::Generator& gen);

// The next recorded mask as the draw gave it (0 or 1, on the CPU, in
// `input`'s dtype), `gen` set to the state that draw left it in.
at::Tensor replay_dropout_mask(DropoutMasks& masks, const at::Tensor& input, double p, at::Generator& gen);

}  // namespace detail
}  // namespace shardplan
