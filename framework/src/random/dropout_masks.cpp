// Dropout masks kept as bits by a recomputed region (shardplan/random.h,
// DropoutMaskScope).
#include "dropout_masks.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "shardplan/error.h"

namespace shardplan {

namespace {

thread_local DropoutMasks* tl_dropout_masks = nullptr;
thread_local DropoutMaskScope::Mode tl_dropout_mode = DropoutMaskScope::Mode::record;

// Byte i holds elements 8i .. 8i+7, element 8i + j in bit j.
at::Tensor pack_mask(const at::Tensor& noise) {
  const int64_t n = noise.numel(), bytes = (n + 7) / 8;
  at::Tensor bits = at::empty({bytes}, at::TensorOptions(at::kByte));
  uint8_t* out = bits.data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, noise.scalar_type(), "pack_mask", [&] {
    const scalar_t* in = noise.data_ptr<scalar_t>();
    at::parallel_for(0, bytes, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t first = 8 * i, count = std::min<int64_t>(8, n - first);
        uint8_t byte = 0;
        for (int64_t j = 0; j < count; ++j)
          byte = static_cast<uint8_t>(byte | (static_cast<uint8_t>(in[first + j] != scalar_t(0)) << j));
        out[i] = byte;
      }
    });
  });
  return bits;
}

at::Tensor unpack_mask(const DropoutMasks::Mask& m) {
  at::Tensor noise = at::empty(m.sizes, at::TensorOptions(m.dtype));
  const int64_t n = noise.numel();
  const uint8_t* in = m.bits.data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, m.dtype, "unpack_mask", [&] {
    scalar_t* out = noise.data_ptr<scalar_t>();
    // Whole bytes in a loop the compiler unrolls; the partial last one apart.
    at::parallel_for(0, n / 8, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const unsigned byte = in[i];
        scalar_t* o = out + 8 * i;
        for (int j = 0; j < 8; ++j) o[j] = static_cast<scalar_t>((byte >> j) & 1u);
      }
    });
    for (int64_t k = n / 8 * 8; k < n; ++k) out[k] = static_cast<scalar_t>((in[k / 8] >> (k % 8)) & 1u);
  });
  return noise;
}

std::string describe(at::IntArrayRef sizes, at::ScalarType dtype, double p) {
  return c10::str(sizes) + " " + c10::toString(dtype) + " p=" + c10::str(p);
}

}  // namespace

DropoutMaskScope::DropoutMaskScope(DropoutMasks& masks, Mode mode)
    : previous_(tl_dropout_masks), previous_mode_(tl_dropout_mode) {
  tl_dropout_masks = &masks;
  tl_dropout_mode = mode;
}

DropoutMaskScope::~DropoutMaskScope() {
  tl_dropout_masks = previous_;
  tl_dropout_mode = previous_mode_;
}

namespace detail {

DropoutMasks* active_dropout_masks(DropoutMaskScope::Mode* mode) {
  *mode = tl_dropout_mode;
  return tl_dropout_masks;
}

void record_dropout_mask(DropoutMasks& masks, const at::Tensor& noise, double p, at::Generator& gen) {
  DropoutMasks::Mask m;
  m.bits = pack_mask(noise);
  m.sizes = noise.sizes().vec();
  m.dtype = noise.scalar_type();
  m.p = p;
  std::lock_guard<std::mutex> lock(gen.mutex());
  m.stream_after = gen.get_state();
  masks.masks.push_back(std::move(m));
}

at::Tensor replay_dropout_mask(DropoutMasks& masks, const at::Tensor& input, double p, at::Generator& gen) {
  const std::string asked = describe(input.sizes(), input.scalar_type(), p);
  if (masks.next >= masks.masks.size())
    throw Error("dropout: replaying a recomputed region asked for a mask (" + asked + ") after the " +
                std::to_string(masks.masks.size()) +
                " its forward drew: the region's forward is not deterministic apart from shardplan::dropout");
  const DropoutMasks::Mask& m = masks.masks[masks.next];
  if (input.sizes() != at::IntArrayRef(m.sizes) || input.scalar_type() != m.dtype || p != m.p)
    throw Error("dropout: replaying a recomputed region asked for mask " + std::to_string(masks.next) + " as " + asked +
                ", its forward drew " + describe(m.sizes, m.dtype, m.p) +
                ": the region's forward is not deterministic apart from shardplan::dropout");
  ++masks.next;
  at::Tensor noise = unpack_mask(m);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(m.stream_after);
  return noise;
}

}  // namespace detail
}  // namespace shardplan
