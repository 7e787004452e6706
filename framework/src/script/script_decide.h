#pragma once
// Internal to the script layer: what the plan makes of each parameter of a
// TorchScript module and of each node that reads one (script_decide.cpp),
// applied by script.cpp and script_rewrite.cpp.
#include <torch/script.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardplan/mesh.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/split.h"

namespace shardplan::script_detail {

enum class Role { Whole, Column, ColumnBias, Row, Vocab, EmbedDim };

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
  Role role = Role::Whole;
  std::string axis;
  int64_t blocks = 1;
  std::vector<ShardSplit> splits;
};

// What one node becomes.
struct Action {
  torch::jit::Graph* graph;
  torch::jit::Node* node;
  Role role;              // of the weight: Column, Row, Vocab or EmbedDim
  const Param* weight;
  const Param* bias;      // a linear's parameter bias, or nullptr
  bool gather = false;    // Column: output gathered
  bool input_sharded = false;  // Row
  std::string axis;
};

struct Decisions {
  std::vector<Param> params;
  std::map<std::string, size_t> by_path;
  std::vector<Action> actions;
};

// Reads the graphs, decides every parameter's role and every node's action,
// and checks what the rewrite cannot do; throws PlanError / Error naming the
// parameter, its rule, the op and its source.
void decide(Decisions& d, const std::vector<std::shared_ptr<torch::jit::Graph>>& graphs, const Mesh& mesh,
            int rank);

// script_rewrite.cpp: the actions applied to the graphs (`group_ids`: mesh
// axis -> register_group id), and one report row per parameter path.
void rewrite(const Decisions& d, const std::map<std::string, int64_t>& group_ids);
void fill_report(ParallelReport& report, const torch::jit::Module& clone, const Decisions& d);

}  // namespace shardplan::script_detail
