#pragma once
// Async tensor parallelism: the matmuls at the edges of a sequence-parallel
// region computed chunk by chunk over a ring of point-to-point exchanges, so
// each chunk's matmul runs while the next chunk travels (JAX's collective
// matmul; the xlstm-jax seed's TPAsyncDense; PyTorch's async TP; Megatron's
// tp_comm_overlap). Forward and backward both overlap.
//
//   gather mode   linear(all_gather(x, dim), w, b): a column-parallel Linear
//                 entered with this rank's part of the sequence. Each rank
//                 multiplies the part it holds while passing it on; after
//                 N - 1 exchanges every part has been multiplied.
//   scatter mode  reduce_scatter(linear(x, w), dim): a row-parallel Linear
//                 leaving onto the sequence. A partial sum per part travels
//                 the ring, each rank adding its own product of that part
//                 as it passes, so it arrives at its owner complete.
//
// Unidirectional rings take N - 1 steps. Bidirectional ones send parts both
// ways and take ceil((N - 1) / 2) steps, the same bytes. Split ones (the
// seed's async_gather_split / async_scatter_split) cut the features (the
// last dim) in two halves that go round the ring in opposite directions:
// N - 1 steps, each moving half the bytes each way. The results equal
// the collective-then-matmul path up to the order of floating-point sums.
// The sequence (dim) must divide over the group; a group of one is a plain
// linear. Under a WholeSequence (mappings.h) both are the plain linear with
// copy_to_group / reduce_from_group.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace shardplan {

class Communicator;

enum class RingDirection { Unidirectional, Bidirectional, Split };

// What ring_gather hands over: `owner`'s tensor, or in Split mode one half
// of it, the features [begin, end) of its last dim.
struct RingPart {
  at::Tensor data;
  int owner;
  int64_t begin, end;
};

// Gather mode with autograd: backward runs the scatter ring for the input's
// gradient, adding up the weight's gradient as it visits each part.
at::Tensor ring_gather_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, Communicator& group,
                              int64_t dim, RingDirection direction);
// Scatter mode with autograd (no bias: a row-parallel bias is added after
// the reduction); backward runs one gather ring for both gradients.
at::Tensor ring_linear_reduce_scatter(const at::Tensor& x, const at::Tensor& w, Communicator& group, int64_t dim,
                                      RingDirection direction);

// The rings themselves, for other layers: `visit` is called for every rank's
// `x` (in Split mode, twice for every other rank's: once per half), this
// rank's first, each while the next is in flight.
void ring_gather(const at::Tensor& x, Communicator& group, RingDirection direction,
                 const std::function<void(const RingPart& part)>& visit);
// The sum over ranks of `partial(r, 0, features)` for this rank r, each
// partial computed (by every rank, for every owner) while the running sums
// travel. `partial(owner, begin, end)` gives the features [begin, end) of
// the last dim, which has `features` in all: the whole range except for
// Split mode's halves. Called once per owner and feature.
at::Tensor ring_reduce_scatter(Communicator& group, RingDirection direction, int64_t features,
                               const std::function<at::Tensor(int owner, int64_t begin, int64_t end)>& partial);

}  // namespace shardplan
