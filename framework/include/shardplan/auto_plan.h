#pragma once
// A plan nobody wrote: auto_plan looks at which shardable layers a model has
// and how they feed each other, and pairs them the Megatron way so that one
// all-reduce per block is enough (docs/AUTO_PLAN.md):
//   - Linear -> elementwise ops -> Linear: the first column-parallel with its
//     output left split, the second row-parallel reading that split (the MLP);
//     several column-parallel producers joined elementwise (a gated MLP) too;
//   - Conv -> per-channel ops (activations, pooling) -> Conv: output-channel
//     then input-channel parallel;
//   - MultiheadAttention: head-parallel (in_proj split by heads, out_proj
//     row-parallel on the heads' context);
//   - LSTM: hidden-parallel, gate-aware;
//   - a Linear whose output reaches a CrossEntropyLoss only through reshapes
//     (an LM head): vocab-parallel, with the parallel cross-entropy, and an
//     Embedding as large as that vocabulary: vocab-parallel.
// How layers feed each other is read from a probe: the model runs once,
// unsharded and in eval mode, on an example input, with every shardable
// layer recording its input and output; the autograd graph of the result
// then says which layer's output reaches which layer's input and through
// which operations, and who else consumes it. A pair is made only when the
// split activation is consumed by nothing but the chain into its partner.
// Anything the planner is unsure of stays replicated, and the plan's comment
// says why; every rule carries a comment saying why it is there.
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardplan/plan.h"

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace shardplan {

class World;
struct ParallelReport;

struct AutoPlanOptions {
  // The mesh axis the rules shard over; the plan's mesh is {axis: auto}.
  std::string axis = "model";
  // Runs the model once on an example input and returns a tensor whose
  // autograd graph reaches everything the caller uses: the loss (then an LM
  // head's logits may stay split into the parallel cross-entropy, as
  // plans/gpt.yaml does) or the output (then the output stays whole). The
  // values do not matter, only the graph: every rank may use its own input.
  // Without a probe only self-contained layers (attention, LSTM) are
  // sharded, since pairs need to know who feeds whom.
  std::function<at::Tensor(torch::nn::Module&)> probe;
};

// A plan for `model` at `world_size` ranks (its mesh: {axis: auto}).
// Deterministic: every rank computes the same plan from an identically
// built model. The model is left as it was (strategies, training mode,
// gradients). Throws shardplan::Error when the model is already sharded or
// the probe throws (naming it). A model with nothing to shard gets a plan
// with no rules, whose comment says so (it runs, replicated).
Plan auto_plan(torch::nn::Module& model, int world_size, const AutoPlanOptions& options = {});

// parallelize() with auto_plan(model, world.size(), options).
ParallelReport parallelize(torch::nn::Module& model, World& world, const AutoPlanOptions& options);

}  // namespace shardplan
