#pragma once
// Internal to the script layer: what the plan makes of each parameter of a
// TorchScript module and of each node that reads one (script_decide.cpp,
// through the rewrites of shardplan/script_rewrite.h), applied by script.cpp
// and script_rewrite.cpp.
#include <torch/script.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/mesh.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/script_rewrite.h"
#include "shardplan/split.h"

namespace shardplan::script_detail {

struct Use {
  torch::jit::Node* node;
  size_t input;
  std::string path;  // the parameter path this read went through (tied tensors have several)
};

// One parameter tensor; tied paths share one.
struct Param {
  std::vector<std::string> paths;  // named_parameters() order
  at::Tensor original;
  std::vector<const Assignment*> assignments;  // per path
  std::vector<Use> uses;
  bool split = false;              // a rewrite (or the one it follows) cuts it
  int64_t dim = 0;
  int64_t blocks = 1;
  bool uneven = true;              // every read allows an uneven cut
  std::string axis;
  std::string note;                // the report's
  std::string follows;             // the path of the parameter whose cut it follows
  std::vector<ShardSplit> splits;
};

// One read a rewrite applies to.
struct Action {
  const ScriptRewrite* rewrite;
  ScriptRead read;
  ScriptCut cut;
  const Param* param;
};

struct Decisions {
  std::vector<Param> params;
  std::map<std::string, size_t> by_path;
  std::vector<Action> actions;
};

// Reads the graphs, decides every parameter's cut and every read's action,
// and checks what the rewrites cannot do; throws PlanError / Error naming the
// parameter, its rule, the op and its source.
void decide(Decisions& d, const std::vector<std::shared_ptr<torch::jit::Graph>>& graphs, const Mesh& mesh,
            int rank);

// Throws "parameter '<path>': <what>", a PlanError at its rule when it has one.
[[noreturn]] void fail(const Param& p, const std::string& what);

// A value an action's rewrite left split along its last dim
// (ScriptGraphEdit::output_sharded), on the group with register_group id `group`.
struct ShardedOutput {
  torch::jit::Value* value;
  const Action* action;
  int64_t group;
};

// script_loss.cpp: each aten::cross_entropy_loss a sharded output reaches
// through ops that keep its last dim becomes shardplan::vocab_cross_entropy;
// one it reaches through any other op is refused (fail). Returns what to add
// to the notes of the parameters whose outputs did (by Param).
std::vector<std::pair<const Param*, std::string>> vocab_parallel_losses(const std::vector<ShardedOutput>& outputs);

// script_rewrite.cpp: the actions applied to the graphs (`group_ids`: mesh
// axis -> register_group id; `mesh` and `rank` give each its coordinate),
// then the losses they reach made vocab-parallel (their notes added to d),
// and one report row per parameter path.
void rewrite(Decisions& d, const std::map<std::string, int64_t>& group_ids, const Mesh& mesh, int rank);
void fill_report(ParallelReport& report, const torch::jit::Module& clone, const Decisions& d);

}  // namespace shardplan::script_detail
