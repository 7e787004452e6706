#pragma once
// Applying a plan to a TorchScript module (docs/TORCHSCRIPT.md): a model
// exported from Python with torch.jit.script and loaded with torch::jit::load
// is sharded without rewriting it in C++. The rules match the TorchScript
// parameter paths (Python's state_dict names); the graph of each named method
// is inlined and its aten::linear / aten::embedding nodes that read a planned
// weight get the conjugate communication ops (shardplan::copy_to, ...,
// TorchScript custom operators calling mappings.h); the plan's `divide` key
// divides integer attributes such as a head count; an aten::cross_entropy_loss
// that logits left sharded reach becomes the vocab-parallel one.
#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/parallelize.h"
#include "shardplan/plan.h"

namespace torch {
namespace jit {
struct Module;
}
}  // namespace torch

namespace shardplan {

class Communicator;
class World;

// One output of a verify run (a tensor of forward's result; tuples, lists and
// string-keyed dicts are walked).
struct ScriptOutputDiff {
  std::string name;             // "output", "output[1]", "output['logits']"
  std::vector<int64_t> shape;   // the unsharded module's
  double max_abs = 0;           // the unsharded output's largest magnitude
  double max_diff = 0;          // the sharded one's largest difference to it, over every rank
  std::string problem;          // a rank whose output is missing or of another shape or type
};

// What verify_script found: the sharded module at `world_size` thread ranks
// against the unsharded one on the same probe.
struct ScriptVerification {
  std::string plan_yaml;        // the plan verified, canonical (Plan::to_yaml)
  int world_size = 0;
  std::string dtype;            // "float64", or the module's own where it cannot run in float64
  double tolerance = 0;         // a difference passes up to tolerance * max(1, max_abs)
  std::vector<ScriptOutputDiff> outputs;
  // One backward of a scalar of the float outputs (each element weighed
  // differently): each parameter's gradient, named "gradient of '<path>'",
  // against this rank's piece of the unsharded one. A parameter the forward
  // reads through a tensor no optimizer steps has none: a problem.
  std::vector<ScriptOutputDiff> gradients;
  std::string error;            // the sharded module failed: the first rank's message
  std::vector<ParallelReport> reports;  // each rank's, when sharding succeeded
  bool passed() const;
  std::string str() const;      // one line per output, then the verdict
};

struct ScriptOptions {
  // The methods of the root module whose graphs are rewritten. Another
  // method of the root that reads a split parameter would run on the shards
  // unchanged, so parallelize_script refuses it, naming it: name every
  // method that reads one.
  std::vector<std::string> methods = {"forward"};
  // A traced module bakes head counts and shapes into constants the rewrite
  // can neither divide nor check, so a `divide` (or a column-parallel output
  // left sharded) on one needs a passed verification of this plan at this
  // world size; on other modules it is not needed and not consulted.
  std::shared_ptr<const ScriptVerification> verified;
};

// The sharded module and how it was cut. `module` is a clone of the module
// given, never the module itself: a TorchScript method that has run caches an
// optimized graph that a later rewrite would not reach, and the clone's
// methods have not run.
struct ScriptParallel {
  std::shared_ptr<torch::jit::Module> module;
  ParallelReport report;
  // This rank's group of each mesh axis: what a caller needs to compute a
  // loss from outputs left sharded (output: sharded), e.g. Megatron's
  // vocab_parallel_cross_entropy (shardplan/nn/cross_entropy.h) on logits.
  std::map<std::string, std::shared_ptr<Communicator>> groups;
  // The group of the axis that splits parameter `path` (the LM head's
  // weight: the group its vocabulary is split over). Throws naming the
  // path when the module has no such parameter or the plan does not split it.
  Communicator& group_of(const std::string& path) const;
};

// This rank's clone of `module` sharded by `plan`. Collective over `world`
// (it makes the mesh's axis groups); every rank passes an identical module.
// `module` is not changed and may be shared by ranks that are threads. Throws
// PlanError / shardplan::Error naming the parameter or attribute and its rule:
// a planned parameter read by an op the rewrite does not know (the op and its
// source range are named), a divide attribute missing, a constant, not an
// integer, not divisible or never read by the rewritten methods, a frozen
// module, tied parameters planned two ways, a call the inliner cannot
// resolve (an interface method), a traced module with a `divide` or a
// sharded column-parallel output and no passed ScriptOptions::verified.
ScriptParallel parallelize_script(const torch::jit::Module& module, const Plan& plan, World& world,
                                  const ScriptOptions& options = {});

// Shards `module` by `plan` on `world_size` ranks that are threads of this
// process (the local backend), runs `probe` through each rank's forward and
// through the unsharded module, and compares every output. Float64 where
// the module runs in it (parameters, buffers and floating probe tensors
// converted), its own dtype otherwise; tolerance 0 means 1e-9 in float64 and
// 1e-4 otherwise. Then one backward on each side, and every parameter's
// gradient compared the same way (ScriptVerification::gradients). A plan
// the rewrite refuses, or a sharded forward or backward that throws, is
// reported in `error`, not thrown; an unsharded module that fails on the
// probe throws (the probe is wrong, not the plan).
ScriptVerification verify_script(const torch::jit::Module& module, const Plan& plan, int world_size,
                                 const std::vector<at::Tensor>& probe, const ScriptOptions& options = {},
                                 double tolerance = 0);

// The module's parameters with a tied tensor once (named_parameters()
// order): what an optimizer is given. parameters() lists a tied tensor under
// each of its paths, and Adam given both would step it twice.
std::vector<at::Tensor> unique_parameters(const torch::jit::Module& module);

// Loads a module torch.jit.save wrote; throws one line naming `file` when it
// is missing, not a regular file or not such a module (a torch.save state
// dict, any other bytes), instead of libtorch's message and backtrace.
torch::jit::Module load_script_module(const std::string& file);

// This rank's parameters then buffers by path (named_parameters() /
// named_buffers() order; a tied tensor under each of its paths), detached:
// the local state dict that checkpoint.h's collect_state_dict overload for
// state dicts gathers with the report.
std::vector<std::pair<std::string, at::Tensor>> script_state_dict(const torch::jit::Module& module);

// Copies `state` (as relocate_state_dict cut it) into the module's
// parameters and buffers; each must be present with this rank's shape.
void load_script_state_dict(torch::jit::Module& module,
                            const std::vector<std::pair<std::string, at::Tensor>>& state);

}  // namespace shardplan
