#pragma once
// The seam of parallelize_script (docs/TORCHSCRIPT.md, "Your own rewrite"):
// what a planned parameter becomes is decided by the op its read feeds, and
// each op kind has a rewrite in a registry: aten::linear, aten::embedding and
// aten::t (x @ W.t(), torch.addmm(b, x, W.t())) are built in, registered the
// same way a user registers one for an op the kernel does not handle. A
// rewrite is the TorchScript twin of a layer plugin (shardplan/layer_plugin.h):
// a plugin cuts a C++ module's parameters and wraps its forward; a rewrite
// cuts a parameter where an op reads it and edits the graph around the op.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/plan.h"

namespace torch {
namespace jit {
struct Graph;
struct Node;
struct Value;
}  // namespace jit
}  // namespace torch

namespace shardplan {

// One read of a planned parameter: the node it feeds, as the plan asks.
struct ScriptRead {
  torch::jit::Node* node = nullptr;  // its kind is the registry key
  size_t input = 0;                  // which input of the node the parameter is
  std::string path;                  // the parameter path it was read through
  std::vector<int64_t> shape;        // the parameter's unsharded shape
  Layout layout;                     // that path's layout
  const Rule* rule = nullptr;        // the rule that planned it (options), or nullptr
};

// A parameter of another input that is cut with the read one (a linear's
// bias), or that must stay whole (a bias added after the reduction).
struct ScriptFollower {
  torch::jit::Node* node = nullptr;
  size_t input = 0;
  int64_t dim = 0;                   // the dim cut like the read one's, in the same blocks
};
struct ScriptWhole {
  torch::jit::Node* node = nullptr;
  size_t input = 0;
  std::string why;                   // said when the plan splits it anyway
};

// What a rewrite decides about one read, before any graph changes.
struct ScriptCut {
  int64_t dim = 0;                   // the parameter dim the layout's axis splits
  int64_t blocks = 1;                // in that many stacked blocks (fused projections)
  bool uneven = false;               // the axis need not divide it (a vocab-parallel table)
  std::string note;                  // the report's: "column-parallel (aten::linear)"
  std::vector<ScriptFollower> followers;
  std::vector<ScriptWhole> whole;
};

// The graph edits a rewrite applies, on the group of its parameter's mesh
// axis. Inserted ops are shardplan:: TorchScript operators whose backward
// is their conjugate (shardplan/mappings.h).
class ScriptGraphEdit {
 public:
  virtual ~ScriptGraphEdit() = default;
  virtual torch::jit::Graph& graph() = 0;
  // Identity forward, all-reduced gradient; one per value and group, so
  // q, k and v reading one activation share it.
  virtual torch::jit::Value* copy_to(torch::jit::Value* x) = 0;
  // This rank's slice of `x` along `dim` (gathered gradient); one per value.
  virtual torch::jit::Value* scatter_to(torch::jit::Value* x, int64_t dim) = 0;
  // Every later use of `v` reads its sum over the group / its pieces
  // concatenated along `dim`; returns the new value.
  virtual torch::jit::Value* reduce_after(torch::jit::Value* v) = 0;
  virtual torch::jit::Value* gather_after(torch::jit::Value* v, int64_t dim) = 0;
  // `v` leaves the rewrite split along its last dim over the group (a
  // column-parallel output left sharded): its classes, where it is logits.
  // Torch's cross-entropy on such a slice is silently wrong, so each
  // aten::cross_entropy_loss `v` reaches (directly or through view, reshape,
  // flatten, contiguous or to that keep the last dim) becomes the
  // vocab-parallel one, and one reached through another op is refused.
  virtual void output_sharded(torch::jit::Value* v) = 0;
  // The group's id, for shardplan:: operators that take one ("int group").
  virtual int64_t group() const = 0;
  virtual int64_t parts() const = 0;  // the axis' size
  virtual int64_t index() const = 0;  // this rank's coordinate on it
};

struct ScriptRewrite {
  std::string name;  // "linear", said in errors and the docs' list
  // Throws shardplan::Error (one line: what the layout or node cannot do)
  // for a read it cannot shard; the kernel adds the parameter, its rule and
  // the node's source range.
  std::function<ScriptCut(const ScriptRead&)> decide;
  // Runs after every read is decided and every parameter replaced by its
  // shard (aten::size reads of it already give the unsharded size).
  std::function<void(const ScriptRead&, const ScriptCut&, ScriptGraphEdit&)> apply;
  // apply() destroys its node: such rewrites run after the others.
  bool destroys_node = false;
};

// Registers `rewrite` for a parameter read as input `input` of op `kind`
// ("aten::conv1d", 1), replacing any earlier one (a built-in included).
// Reads no rewrite is registered for are refused, naming the op. The
// registry is process-wide: register before parallelizing, not while ranks
// that are threads are in parallelize_script; `apply` may run on several
// such ranks at once.
void register_script_rewrite(const std::string& kind, size_t input, ScriptRewrite rewrite);

// The rewrite for that read, or nullptr.
const ScriptRewrite* find_script_rewrite(const std::string& kind, size_t input);

// "aten::embedding (0), aten::linear (1), ...": every registered read.
std::string script_rewrite_keys();

}  // namespace shardplan
