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
// copy_to_group for a parameter cut into `pieces` along `dim`, each piece
// held by group.size() / pieces consecutive ranks (ShardSplit::shared; a
// kv head on the ranks whose query heads read it): forward identity,
// backward sums the gradient over the ranks holding the same piece. One
// all-reduce over the group of every piece's size (the others add zeros),
// so no communicator per set of holders is needed.
at::Tensor copy_to_sharers(const at::Tensor& p, Communicator& group, int64_t pieces, int64_t dim = 0);
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

// Sequence parallelism (layer_plugin.h, SequenceShard): activations between
// tensor-parallel layers are split along the sequence dim `dim` (negative:
// from the end). These are the pairs above under the names a layer uses at
// the region's edges, with the sequence checked first so an activation that
// cannot be split fails with one line naming the sizes rather than inside a
// collective.
//
// Entering a layer that needs the whole sequence (a column-parallel Linear,
// attention): all-gather forward, reduce-scatter backward.
at::Tensor gather_sequence(const at::Tensor& x, Communicator& group, int64_t dim);
// Leaving a layer whose output is a partial sum over the group (row-parallel
// Linear, vocab-parallel embedding): reduce-scatter forward, all-gather
// backward.
at::Tensor reduce_scatter_sequence(const at::Tensor& x, Communicator& group, int64_t dim);
// Leaving a layer whose output is whole and identical on every rank (a
// replicated embedding): keep this rank's part forward, all-gather backward.
at::Tensor split_sequence(const at::Tensor& x, Communicator& group, int64_t dim);
// A replicated parameter used on this rank's part of the sequence: identity
// forward, gradient all-reduced backward, so it is the gradient over the
// whole sequence (copy_to_group, named for what it guards against).
at::Tensor sequence_parallel_param(const at::Tensor& p, Communicator& group);
// `dim` of `x` wrapped to [0, x.dim()), after the checks the functions above
// make: the dim exists, and with `split` the sequence divides over the group
// (not checked while a WholeSequence is alive on this thread).
int64_t checked_sequence_dim(const at::Tensor& x, Communicator& group, int64_t dim, bool split);

// While one is alive, this thread's sequence-parallel edges take the
// activations as whole: gather_sequence (and ring_gather_linear's entry) is
// copy_to_group, reduce_scatter_sequence (and ring_linear_reduce_scatter's
// exit) reduce_from_group, split_sequence and sequence_parallel_param the
// identity. A sequence-parallel model then computes what its plan without
// sequence parallelism would, at any sequence length. For decoding one token
// at a time (a length that cannot be split) after a prefill under sequence
// parallelism: a key/value cache holds whole sequences either way. Use it in
// eval mode: dropout inside the region still draws a mask per rank, which
// is right for a split sequence only. Thread-local (ranks may be threads);
// nests.
class WholeSequence {
 public:
  WholeSequence();
  ~WholeSequence();
  WholeSequence(const WholeSequence&) = delete;
  WholeSequence& operator=(const WholeSequence&) = delete;
  // Whether one is alive on this thread.
  static bool active();

 private:
  bool previous_;
};

}  // namespace shardplan
