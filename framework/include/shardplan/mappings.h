#pragma once
// Communication inside autograd, as conjugate pairs: each function's backward
// is the communication its forward's transpose needs (Megatron-core's
// tensor_parallel/mappings.py). Layer plugins compose these; none of them
// changes anything for a group of one, where they return their input.
#include <ATen/core/Tensor.h>

namespace shardplan {

class Communicator;

// Forward identity, backward all-reduce: entering a region where each rank
// computes a partial result from a replicated input (column-parallel input).
at::Tensor copy_to_group(const at::Tensor& x, Communicator& group);
// Forward all-reduce, backward identity: leaving a region of partial sums
// (row-parallel output).
at::Tensor reduce_from_group(const at::Tensor& x, Communicator& group);
// Forward keeps this rank's chunk of `dim`, backward all-gathers: making a
// replicated tensor sharded (row-parallel input that arrives replicated).
at::Tensor scatter_to_group(const at::Tensor& x, Communicator& group, int64_t dim = -1);
// Forward all-gathers along `dim`, backward keeps this rank's chunk:
// making a sharded tensor replicated (column-parallel output, gathered).
at::Tensor gather_from_group(const at::Tensor& x, Communicator& group, int64_t dim = -1);
// Forward reduce-scatter along `dim`, backward all-gather (sequence parallel
// exit of a row-parallel layer).
at::Tensor reduce_scatter_to_group(const at::Tensor& x, Communicator& group, int64_t dim = 0);
// Forward all-gather along `dim`, backward reduce-scatter (sequence parallel
// entry of a column-parallel layer).
at::Tensor all_gather_from_group(const at::Tensor& x, Communicator& group, int64_t dim = 0);

}  // namespace shardplan
