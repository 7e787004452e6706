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
//   - attention written over separate q, k, v and o Linears (Llama's):
//     the same by whole heads, the head size read from the probe, k and v
//     replicated per rank when the axis exceeds their heads (grouped
//     queries), and only when the probe's graph shows each rank's heads
//     computed from that rank's share alone;
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
  // The mesh axis the rules shard over.
  std::string axis = "model";
  // The plan's mesh, as a plan file writes it (a one-line YAML flow map):
  // "{data: 2, model: auto}" plans `axis` inside a 2-D mesh. Sizes are
  // decided at the axis' resolved size (the world size over the other axes':
  // 2 of 4 ranks here), and the other axis becomes the plan's batch axis
  // (data parallelism, as plans/gpt_2d.yaml). Empty: {axis: auto}, the whole
  // world over `axis`. At most one axis besides `axis`; a mesh that is not
  // such a map, does not fit the world size or lacks `axis` is an Error.
  std::string mesh;
  // Runs the model once on an example input and returns a tensor whose
  // autograd graph reaches everything the caller uses: the loss (then an LM
  // head's logits may stay split into the parallel cross-entropy, as
  // plans/gpt.yaml does) or the output (then the output stays whole). The
  // values do not matter, only the graph: every rank may use its own input.
  // Without a probe only self-contained layers (attention, LSTM) are
  // sharded, since pairs need to know who feeds whom.
  std::function<at::Tensor(torch::nn::Module&)> probe;
};

// A plan for `model` at `world_size` ranks (its mesh: options.mesh).
// Deterministic: every rank computes the same plan from an identically
// built model. The model is left as it was (strategies, training mode,
// gradients). Throws shardplan::Error when the model is already sharded or
// the probe throws (naming it). A model with nothing to shard gets a plan
// with no rules, whose comment says so (it runs, replicated).
Plan auto_plan(torch::nn::Module& model, int world_size, const AutoPlanOptions& options = {});

// parallelize() with auto_plan(model, world.size(), options).
ParallelReport parallelize(torch::nn::Module& model, World& world, const AutoPlanOptions& options);

// For models that are not torch::nn modules and cannot be probed here (a
// TorchScript file, a checkpoint's names and shapes: `shardplan plan auto`),
// whose caller found the units itself. A rule for one parameter path, and
// why it is there (the rule's comment):
struct AutoPlanRule {
  std::string path;
  Layout layout;
  std::vector<std::pair<std::string, std::string>> options;  // {"output", "sharded"}
  std::string why;
};
// Rules sharded together or not at all (a column half is wrong without its
// row half); `layers` names them in the header when the unit is dropped.
struct AutoPlanUnit {
  std::vector<std::string> layers;
  std::vector<AutoPlanRule> rules;
};
// The units written as auto_plan writes a plan (mesh and batch axis from
// options.mesh, one \d+ rule for numbered blocks), after dropping each unit
// whose rules do not fit `params` (a path missing, a layout of another rank,
// a split dim the model axis' size does not divide), with the reason in the
// header. `origin` ends the header's first line ("from the names and shapes
// of gpt.pt only"); `replicated` are the caller's own "layer: why" lines.
// No plugin is consulted: the caller says how sure it is. Errors as auto_plan.
Plan auto_plan_for_units(const std::vector<ParamInfo>& params, const std::vector<AutoPlanUnit>& units,
                         const std::vector<std::string>& replicated, int world_size, const AutoPlanOptions& options,
                         const std::string& origin);

}  // namespace shardplan
