#pragma once
// Activation recomputation (the plan's `recompute:` key, docs/PLAN_FORMAT.md):
// a region of a forward keeps only its inputs, and backward runs it again to
// get the activations its gradients need, as torch.utils.checkpoint with
// use_reentrant=True and Megatron's activation checkpointing do.
//
// A region's forward runs without autograd; its backward restores the random
// streams of the region's forward (the RngTracker's, shardplan/random.h, and
// the RngFork it ran in), runs it again with autograd on detached inputs, and
// takes the gradients of its inputs and of the parameters it names. Those
// parameter gradients leave backward through the region's own autograd node,
// so they reach the parameters (and DataParallel's gradient hooks) once, in
// the outer backward, like any other gradient. Communication inside a region
// (tensor-parallel all-reduces, sequence-parallel gathers, async rings) runs
// again in backward, in the same order on every rank, because every rank
// reaches the region's node at the same point of the same graph.
//
// HOW A MODULE OPTS IN: derive from Recomputable and route the forward's
// body through recompute_full (or, for attention's core, recompute_selective):
//
//   class BlockImpl : public torch::nn::Cloneable<BlockImpl>, public shardplan::Recomputable {
//     at::Tensor forward(const at::Tensor& x, const at::Tensor& mask) {
//       return recompute_full([this](const std::vector<at::Tensor>& in) { return body(in[0], in[1]); },
//                             {x, mask});
//     }
//   };
//
// Until parallelize() applies a plan whose `recompute:` names the module,
// both run the body directly (bit-identical to not using them). A region's
// forward must be deterministic apart from shardplan::dropout; one that draws
// other random numbers is caught in backward by a checksum of its outputs and
// stops with one line naming the module.
#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace shardplan {

enum class RecomputeMode { none, full, selective };
const char* recompute_mode_name(RecomputeMode mode);  // "none", "full", "selective"

using RecomputeFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Runs fn(inputs) as a recomputed region: only `inputs` (undefined ones
// allowed) and the random streams' states are kept for backward. `params`
// are the parameters the region reads; their gradients come out of the
// region's node. `what` names the region in errors. Without grad mode, or
// while a region is being recomputed (nested regions run inside the outer
// one), fn(inputs) runs directly. A `selective` region (attention's core)
// also keeps the masks shardplan::dropout draws in it, as bits
// (DropoutMaskScope, shardplan/random.h), and backward takes them back
// instead of drawing them again: they are 1/32 of the probabilities the
// region does not keep, and drawing them again on the CPU costs more than
// the rest of the rerun. Its rerun also skips recompute_final_bmm's product.
std::vector<at::Tensor> recompute(const RecomputeFn& fn, const std::vector<at::Tensor>& inputs,
                                  const std::vector<at::Tensor>& params, const std::string& what,
                                  bool selective = false);

// a.bmm(b) ([n, i, k] x [n, k, j]) for the product that ends a selective
// region (attention's probabilities times values). Its backward needs a and
// b only, so when backward reruns the region the product is not computed
// (its result is left uninitialised: the rerun's outputs are then only the
// graph the gradients flow through), and the region's determinism check
// compares a sample of `a` with its forward's instead of the outputs.
// Anywhere else (no selective region, or a region nested in one) a.bmm(b).
at::Tensor recompute_final_bmm(const at::Tensor& a, const at::Tensor& b);

// True on a thread while backward computes a region's gradients (the inner
// autograd pass). libtorch 2.x runs a leaf's gradient hooks there too (1.13
// does not); hooks that act on gradients (DataParallel's) ignore that call:
// the same gradient reaches the parameter again when the region's node
// returns it to the outer backward.
bool in_recompute_backward();

// A module that can recompute its forward (full) or attention's core
// (selective) in backward; parallelize() sets the mode the plan names.
class Recomputable {
 public:
  virtual ~Recomputable() = default;
  // The modes this module implements; parallelize() refuses the others,
  // naming the module and its type.
  virtual bool can_recompute(RecomputeMode mode) const { return mode == RecomputeMode::full; }

  RecomputeMode recompute_mode() const { return recompute_mode_; }
  // `path` names the module in errors ("blocks.0").
  void set_recompute_mode(RecomputeMode mode, const std::string& path = "");

 protected:
  // fn(inputs) (one output), recomputed over the module's parameters when
  // the mode is full; run directly otherwise.
  at::Tensor recompute_full(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn,
                            const std::vector<at::Tensor>& inputs);
  // fn(inputs), recomputed without parameters when the mode is selective
  // (attention's core reads none), its dropout masks kept as bits and its
  // recompute_final_bmm not computed again; run directly otherwise.
  std::vector<at::Tensor> recompute_selective(const RecomputeFn& fn, const std::vector<at::Tensor>& inputs);

 private:
  std::string what() const;
  RecomputeMode recompute_mode_ = RecomputeMode::none;
  std::string recompute_path_;
};

}  // namespace shardplan
