#pragma once
// Applying a plan to a TorchScript module (docs/TORCHSCRIPT.md): a model
// exported from Python with torch.jit.script and loaded with torch::jit::load
// is sharded without rewriting it in C++. The rules match the TorchScript
// parameter paths (Python's state_dict names); the graph of each named method
// is inlined and its aten::linear / aten::embedding nodes that read a planned
// weight get the conjugate communication ops (shardplan::copy_to, ...,
// TorchScript custom operators calling mappings.h); the plan's `divide` key
// divides integer attributes such as a head count.
#include <ATen/core/Tensor.h>

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

class World;

struct ScriptOptions {
  // The methods of the root module whose graphs are rewritten. A method not
  // named here still runs, unsharded, on the shards: name every method that
  // reads a planned parameter.
  std::vector<std::string> methods = {"forward"};
};

// The sharded module and how it was cut. `module` is a clone of the module
// given, never the module itself: a TorchScript method that has run caches an
// optimized graph that a later rewrite would not reach, and the clone's
// methods have not run.
struct ScriptParallel {
  std::shared_ptr<torch::jit::Module> module;
  ParallelReport report;
};

// This rank's clone of `module` sharded by `plan`. Collective over `world`
// (it makes the mesh's axis groups); every rank passes an identical module.
// `module` is not changed and may be shared by ranks that are threads. Throws
// PlanError / shardplan::Error naming the parameter or attribute and its rule:
// a planned parameter read by an op the rewrite does not know (the op and its
// source range are named), a divide attribute missing, a constant, not an
// integer, not divisible or never read by the rewritten methods, a frozen
// module, tied parameters planned two ways, a call the inliner cannot
// resolve (an interface method).
ScriptParallel parallelize_script(const torch::jit::Module& module, const Plan& plan, World& world,
                                  const ScriptOptions& options = {});

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
