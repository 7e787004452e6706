// parallelize and check_plan: a plan applied to a model (or only checked
// against it), each module's plugin cutting its shard, tied tensors kept one.
#include "shardplan/parallelize.h"

#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shardplan/agreement.h"
#include "shardplan/error.h"
#include "shardplan/helpers.h"
#include "shardplan/layer_plugin.h"
#include "shardplan/random.h"
#include "shardplan/world.h"
#include "plan/plan_internal.h"
#include "planning.h"

namespace shardplan {

using parallel_detail::Planned;
using parallel_detail::plan_model;
using parallel_detail::TieUse;
using plan_detail::shape_str;

namespace {

ParallelReport report_of(Planned&& p, int world_size, int rank, torch::nn::Module& model) {
  ParallelReport r;
  r.mesh = p.mesh;
  r.rank = rank;
  r.world_size = world_size;
  r.rows = std::move(p.rows);
  r.warnings = std::move(p.warnings);
  r.plan_yaml = p.plan_yaml;
  r.recompute = std::move(p.recompute_rows);
  auto params = model.named_parameters(true);
  for (auto& row : r.rows) {
    auto* t = params.find(row.path);
    row.element_size = t ? static_cast<int64_t>(t->element_size()) : 0;
  }
  return r;
}

// A tied tensor is sliced by the first module's plugin for every module
// sharing it. Each later module's plugin slices what its module holds, so
// it gets the whole tensor back and must come out with the same shard.
struct TieState {
  at::Tensor tensor, full, shard;
  std::string sliced_as;  // the parameter path whose plugin sliced it first
};

struct Ties {
  std::vector<TieState> state;  // parallel to Planned::ties
  std::unordered_map<torch::nn::Module*, std::vector<size_t>> of_module;
};

Ties ties_of(const Planned& p) {
  Ties ties;
  ties.state.resize(p.ties.size());
  for (size_t t = 0; t < p.ties.size(); ++t) {
    ties.state[t].tensor = p.ties[t][0].module->named_parameters(false)[p.ties[t][0].name];
    ties.state[t].full = ties.state[t].tensor.detach();
    for (const TieUse& u : p.ties[t]) ties.of_module[u.module].push_back(t);
  }
  return ties;
}

// After `module`'s plugin ran: the first shard cut from a tied tensor is the
// one every later use must come out with.
void keep_tie_shard(TieState& tie, const std::vector<TieUse>& uses, torch::nn::Module* module, int rank) {
  std::string path;
  for (const TieUse& u : uses)
    if (u.module == module) path = u.path;
  if (!tie.shard.defined()) {
    tie.shard = tie.tensor.detach();
    tie.sliced_as = path;
  } else if (tie.tensor.sizes() != tie.shard.sizes() || !tie.tensor.equal(tie.shard)) {
    throw Error("tied parameters '" + tie.sliced_as + "' and '" + path +
                "' are one tensor, but their layer plugins cut different shards from it (" +
                shape_str(tie.shard.sizes().vec()) + " and " + shape_str(tie.tensor.sizes().vec()) + " on rank " +
                std::to_string(rank) + "): plan them alike or untie them");
  }
}

void check_ties_kept(const Planned& p, const Ties& ties) {
  for (size_t t = 0; t < p.ties.size(); ++t)
    for (const TieUse& u : p.ties[t]) {
      auto params = u.module->named_parameters(false);
      const at::Tensor* now = params.find(u.name);
      if (!now || now->unsafeGetTensorImpl() != ties.state[t].tensor.unsafeGetTensorImpl())
        throw Error("parameter '" + u.path + "' was tied to '" + p.ties[t][0].path +
                    "', but its layer plugin registered a new tensor for it: the tie would be lost");
    }
}

// Each module's plugin cuts its shard, tied tensors handed to every use whole.
void apply_shards(Planned& p, const std::map<std::string, std::shared_ptr<Communicator>>& groups, int rank) {
  Ties ties = ties_of(p);
  for (size_t i = 0; i < p.shards.size(); ++i) {
    p.shards[i].groups = groups;
    auto tied = ties.of_module.find(p.shards[i].module);
    if (tied != ties.of_module.end())
      for (size_t t : tied->second)
        if (ties.state[t].shard.defined()) ties.state[t].tensor.set_data(ties.state[t].full);
    p.plugins[i]->apply(p.shards[i]);
    if (tied == ties.of_module.end()) continue;
    for (size_t t : tied->second) keep_tie_shard(ties.state[t], p.ties[t], p.shards[i].module, rank);
  }
  check_ties_kept(p, ties);
}

std::string path_of(const Planned& p, const Recomputable* module) {
  for (size_t i = 0; i < p.recompute.size(); ++i)
    if (p.recompute[i].first == module) return p.recompute_rows[i].path;
  return "";
}

// get_parallel_dim(param) answers for what a plan cut as for what a user
// declared by hand (helpers.h).
void register_splits(torch::nn::Module& model, const ParallelReport& report) {
  auto params = model.named_parameters();
  for (const ReportRow& row : report.rows)
    if (!row.splits.empty())
      if (const at::Tensor* t = params.find(row.path)) register_parallel_split(*t, row.splits.front());
}

}  // namespace

std::shared_ptr<Communicator> ModuleShard::group(const std::string& axis) const {
  auto it = groups.find(axis);
  if (it == groups.end()) throw Error("module '" + path + "': no process group for mesh axis '" + axis + "'");
  return it->second;
}

ParamShard* ModuleShard::param(const std::string& name) {
  for (auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

const ParamShard* ModuleShard::param(const std::string& name) const {
  for (const auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

ParallelReport check_plan(torch::nn::Module& model, const Plan& plan, int world_size, int rank) {
  Planned p = plan_model(model, plan, world_size, rank);
  return report_of(std::move(p), world_size, rank, model);
}

ParallelReport check_plan(torch::nn::Module& model, const Plan& plan, int world_size, int rank,
                          std::vector<std::string>& errors) {
  Planned p = plan_model(model, plan, world_size, rank, &errors);
  return report_of(std::move(p), world_size, rank, model);
}

ParallelReport parallelize(torch::nn::Module& model, const Plan& plan, World& world) {
  // First, while the model is untouched: ranks that disagree would cut
  // incompatible shards, and one whose planning throws would leave the
  // others waiting in the group creation below.
  check_ranks_agree(model, plan, world.comm());
  Planned p = plan_model(model, plan, world.size(), world.rank());
  for (auto& s : p.shards) s.mesh = &p.mesh;  // p was moved out of plan_model
  // Groups are created collectively, so every rank asks for all of them even
  // when none of its modules needs one.
  auto groups = world.groups(p.mesh);
  // Dropout after this draws from per-rank streams over the plan's mesh.
  ensure_rng_tracker(world, p.mesh);
  // Slicing parameters into shards is not part of any graph; with grad mode
  // on, every narrow and copy of a parameter (which requires grad) would
  // record autograd nodes, which made up a third of applying a plan to a
  // 10,000-parameter model at world size 2.
  at::NoGradGuard no_grad;
  apply_shards(p, groups, world.rank());
  for (const auto& [module, mode] : p.recompute) module->set_recompute_mode(mode, path_of(p, module));
  ParallelReport report = report_of(std::move(p), world.size(), world.rank(), model);
  register_splits(model, report);
  return report;
}

}  // namespace shardplan
