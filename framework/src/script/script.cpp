// A plan applied to a TorchScript module: clone, inline the named methods,
// decide (script_decide.cpp), check the divided attributes, then replace the
// parameters through their existing slots and insert the communication ops.
#include "shardplan/script.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <mutex>

#include "script_decide.h"
#include "script_internal.h"
#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"

namespace shardplan {

using script_detail::Action;
using script_detail::Decisions;
using script_detail::Param;
using torch::jit::Graph;
using torch::jit::Module;
using torch::jit::Node;
using torch::jit::Value;

// Type names come from the file: a plain scan, where std::regex_replace
// recursed once per character of the name.
std::string script_detail::unmangled_type_name(const std::string& name) {
  static const std::string kMangle = "___torch_mangle_";
  std::string out;
  size_t copied = 0;
  for (size_t at = name.find(kMangle); at != std::string::npos; at = name.find(kMangle, at + 1)) {
    size_t end = at + kMangle.size();
    while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
    if (end == at + kMangle.size() || end >= name.size() || name[end] != '.') continue;
    out.append(name, copied, at - copied);
    copied = end + 1;
    at = end;
  }
  return out.append(name, copied, std::string::npos);
}

std::mutex& script_detail::jit_mutex() {
  static std::mutex m;
  return m;
}

namespace {

std::map<std::string, Module> modules_by_path(const Module& m) {
  std::map<std::string, Module> out;
  for (const auto& nm : m.named_modules()) out.emplace(nm.name, nm.value);
  return out;
}

std::pair<std::string, std::string> owner_and_name(const std::string& path) {
  const auto dot = path.rfind('.');
  if (dot == std::string::npos) return {"", path};
  return {path.substr(0, dot), path.substr(dot + 1)};
}

std::string type_name(const Module& m) {
  return script_detail::unmangled_type_name(m.type()->name()->qualifiedName());
}

Module clone_unrun(const Module& module) {
  if (!module.hasattr("training"))
    throw Error("the TorchScript module is frozen (torch.jit.freeze folded its parameters into constants), so "
                "there is nothing to shard: parallelize the module before freezing it");
  Module clone;
  {
    // Without the guard the clone's parameters would be non-leaf copies.
    at::NoGradGuard no_grad;
    clone = module.clone();
  }
  return clone;
}

// Parameters grouped by tensor: a tied tensor appears under each path.
Decisions inventory(const Module& original, const PlanMatch& match) {
  Decisions d;
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& p : original.named_parameters()) named.emplace_back(p.name, p.value);
  for (size_t i = 0; i < named.size(); ++i) {
    size_t k = 0;
    while (k < d.params.size() && !d.params[k].original.is_same(named[i].second)) ++k;
    if (k == d.params.size()) {
      d.params.emplace_back();
      d.params.back().original = named[i].second;
    }
    d.params[k].paths.push_back(named[i].first);
    d.params[k].assignments.push_back(&match.params[i]);
    d.by_path[named[i].first] = k;
  }
  return d;
}

// The model axis a divide divides by: the one axis that does not split the batch.
std::string divide_axis(const Plan& plan, const Mesh& mesh) {
  std::vector<std::string> axes;
  for (const auto& a : mesh.axes())
    if (a.first != plan.batch_axis()) axes.push_back(a.first);
  if (axes.size() != 1)
    throw PlanError(plan.divide_loc, "divide needs exactly one mesh axis besides the batch axis to divide by; the mesh " +
                                         mesh.str() + " has " + std::to_string(axes.size()));
  return axes.front();
}

int64_t reads_of(const std::vector<std::shared_ptr<Graph>>& graphs, const std::string& module, const std::string& attr) {
  int64_t reads = 0;
  for (const auto& g : graphs)
    for (Node* n : script_detail::all_nodes(g->block()))
      if (n->kind() == torch::jit::prim::GetAttr && n->s(torch::jit::attr::name) == attr &&
          script_detail::attr_path(n->input(0), g->inputs()[0]) == module)
        ++reads;
  return reads;
}

// Checks every divide first, then divides: a failing plan changes nothing.
// A traced module keeps no attributes, or keeps them unread: what the rule
// names is baked into constants, left to the verification that admitted it.
void divide_attributes(const Plan& plan, const Mesh& mesh, Module& clone,
                       const std::vector<std::shared_ptr<Graph>>& graphs, bool traced,
                       std::vector<std::string>& warnings) {
  if (plan.divide.empty()) return;
  const int64_t parts = mesh.axis_size(divide_axis(plan, mesh));
  std::vector<std::tuple<Module, std::string, int64_t>> todo;
  for (const DivideRule& d : plan.divide) {
    bool matched = false;
    for (const auto& [path, m] : modules_by_path(clone)) {
      if (!d.matches(path)) continue;
      matched = true;
      for (size_t i = 0; i < d.attributes.size(); ++i) {
        const std::string& attr = d.attributes[i];
        const std::string what = "divide: attribute '" + attr + "' of module '" + path + "' (" + type_name(m) + ")";
        const SourceLoc& loc = d.attribute_locs[i];
        if (m.type()->hasConstant(attr))
          throw PlanError(loc, what + " is a constant (__constants__ or Final), inlined into the graph where it "
                                      "cannot be divided: make it a plain attribute before scripting");
        if (traced && (!m.hasattr(attr) || reads_of(graphs, path, attr) == 0)) {
          warnings.push_back(what + " is baked into the traced graph's constants; not divided");
          continue;
        }
        if (!m.hasattr(attr)) throw PlanError(loc, what + " does not exist (a traced module keeps none)");
        const c10::IValue v = m.attr(attr);
        if (!v.isInt()) throw PlanError(loc, what + " is not an integer");
        if (v.toInt() % parts != 0)
          throw PlanError(loc, what + " = " + std::to_string(v.toInt()) + " is not divisible by " +
                                   std::to_string(parts));
        if (reads_of(graphs, path, attr) == 0)
          throw PlanError(loc, what + " is never read by the rewritten methods, so dividing it changes nothing");
        todo.emplace_back(m, attr, v.toInt() / parts);
      }
    }
    if (!matched) throw PlanError(d.loc, "divide: pattern '" + d.pattern + "' matches no module");
  }
  for (auto& [m, attr, value] : todo) m.setattr(attr, value);
}

std::optional<int64_t> int_attr(const Module& m, const std::string& name) {
  if (!m.hasattr(name) || !m.attr(name).isInt()) return std::nullopt;
  return m.attr(name).toInt();
}

const std::vector<std::string> kHeadCounts = {"n_head",  "n_heads", "num_heads", "num_attention_heads",
                                              "num_key_value_heads", "n_kv_heads", "num_kv_heads"};

// A module's head size as it states it (head_dim / head_size, or its width
// over its query heads), with what it was read from; nullopt when it states none.
std::optional<std::pair<int64_t, std::string>> head_size(const Module& m) {
  for (const char* name : {"head_dim", "head_size"})
    if (auto v = int_attr(m, name); v && *v > 0) return std::make_pair(*v, std::string(name));
  for (const char* heads : {"n_head", "n_heads", "num_heads", "num_attention_heads"})
    for (const char* width : {"hidden_size", "embed_dim", "n_embd", "d_model"}) {
      const auto n = int_attr(m, heads), w = int_attr(m, width);
      if (n && w && *n > 0 && *w % *n == 0)
        return std::make_pair(*w / *n, std::string(width) + " / " + heads);
    }
  return std::nullopt;
}

// Where a module states its head size, each rank's rows of a projection it
// owns that the plan cuts by rows must be whole heads of that size for one of
// the head counts its methods read (after the divide). A plan that divides
// the head size, or forgets to divide a count, would otherwise make heads of
// another size that still run (a view of 12 features as 4 heads of 3).
void check_head_sizes(const Plan& plan, const Module& original, const Module& clone, const Decisions& d,
                      const std::vector<std::shared_ptr<Graph>>& graphs) {
  const auto originals = modules_by_path(original);
  for (const auto& [path, m] : modules_by_path(clone)) {
    const auto size = head_size(originals.at(path));
    if (!size) continue;
    std::vector<std::pair<std::string, int64_t>> counts;
    for (const auto& c : kHeadCounts)
      if (auto v = int_attr(m, c); v && *v > 0 && reads_of(graphs, path, c) > 0) counts.emplace_back(c, *v);
    if (counts.empty()) continue;
    for (const Param& p : d.params) {
      const std::string owner = owner_and_name(p.paths.front()).first;
      const bool below = owner == path || owner_and_name(owner).first == path;
      if (!p.split || p.dim != 0 || !p.follows.empty() || p.original.dim() != 2 || !below) continue;
      const int64_t cut = p.blocks * p.splits.front().parts;
      if (p.original.size(0) % cut != 0) continue;
      const int64_t rows = p.original.size(0) / cut;
      std::string as;
      bool whole = false;
      for (const auto& [c, n] : counts) {
        whole = whole || rows == n * size->first;
        as += std::string(as.empty() ? "" : ", ") + c + " = " + std::to_string(n) +
              (rows % n == 0 ? " heads of " + std::to_string(rows / n) : " heads");
      }
      if (whole) continue;
      script_detail::fail(p, "module '" + path + "' (" + type_name(m) + ") has a head size of " +
                                 std::to_string(size->first) + " (" + size->second + "), but this rank's " +
                                 std::to_string(rows) + " rows" + (p.blocks > 1 ? " per block" : "") + " read as " +
                                 as + (plan.divide.empty() ? " (the plan has no divide)" : " after the divide at " +
                                 plan.divide_loc.str()) + ": divide the head counts, not the head size, so each "
                                 "rank keeps whole heads of " + std::to_string(size->first));
    }
  }
}

at::Tensor shard_tensor(const Param& p) {
  at::NoGradGuard no_grad;
  at::Tensor t = p.original.detach();
  for (const ShardSplit& s : p.splits) t = take_split(t, s);
  return t.contiguous().clone().set_requires_grad(p.original.requires_grad());
}

// The non-parameter attributes (buffers, lists, tuples: an RNN's
// _flat_weights) of every module of `clone` that hold `t`, by path. One level
// of list or tuple is looked into: what a module caches is a flat list.
std::vector<std::string> aliases_of(const Module& clone, const at::Tensor& t) {
  std::vector<std::string> out;
  for (const auto& nm : clone.named_modules()) {
    const auto& type = nm.value.type();
    for (size_t i = 0; i < type->numAttributes(); ++i) {
      if (type->is_parameter(i)) continue;
      const c10::IValue v = nm.value._ivalue()->getSlot(i);
      std::vector<c10::IValue> items{v};
      if (v.isList()) items = v.toListRef().vec();
      if (v.isTuple()) items = v.toTupleRef().elements().vec();
      for (const auto& item : items)
        if (item.isTensor() && item.toTensor().is_same(t)) {
          out.push_back((nm.name.empty() ? "" : nm.name + ".") + type->getAttributeName(i));
          break;
        }
    }
  }
  return out;
}

// A split parameter gets a new leaf (its shard) in every slot, so ties
// survive the clone. One kept whole is not replaced: the clone's tensor
// becomes the leaf, because a module may read it through another attribute
// (an RNN's _flat_weights) that a replaced slot would leave holding a tensor
// no optimizer steps. A split one held elsewhere too would be read whole
// there, so it is refused.
void replace_parameters(Module& clone, const Decisions& d) {
  auto mods = modules_by_path(clone);
  at::NoGradGuard no_grad;
  for (const Param& p : d.params) {
    auto [owner0, name0] = owner_and_name(p.paths.front());
    at::Tensor mine = mods.at(owner0).attr(name0).toTensor();
    if (!p.split) {
      if (mine.requires_grad() != p.original.requires_grad()) mine.set_requires_grad(p.original.requires_grad());
      continue;
    }
    const auto held = aliases_of(clone, mine);
    if (!held.empty())
      script_detail::fail(p, "is also held by attribute '" + held.front() + "', which the forward may read in its "
                             "place and no rewrite can cut; leave the parameter replicated");
    const at::Tensor t = shard_tensor(p);
    for (const auto& path : p.paths) {
      auto [owner, name] = owner_and_name(path);
      mods.at(owner).register_parameter(name, t, /*is_buffer=*/false);
    }
  }
}

// What about this plan a traced module cannot show statically, or "".
std::string needs_verifying(const Plan& plan, const Decisions& d) {
  if (!plan.divide.empty()) return "its divide (" + plan.divide_loc.str() + ")";
  for (const Action& a : d.actions)
    if (a.read.rule && a.read.rule->option_or("output", "") == "sharded")
      return "the sharded output of '" + a.read.path + "' (output: sharded)";
  return "";
}

// A traced graph's shapes are constants: whether shard-sized activations
// still fit them only a run can tell.
void require_verified(const Plan& plan, int world_size, const Decisions& d, const std::string& traced,
                      const ScriptOptions& options, std::vector<std::string>& warnings) {
  const std::string what = needs_verifying(plan, d);
  if (what.empty()) return;
  const std::string head = "the module is traced (torch.jit.trace: " + traced +
                           " is recorded without a column): its head counts and shapes are constants, so only a run "
                           "can show whether " + what + " still fits them";
  const ScriptVerification* v = options.verified.get();
  if (!v) {
    const std::string msg = head + ": run verify first (shardplan::verify_script, passed as "
                                   "ScriptOptions::verified, or `shardplan plan check PLAN.yaml --script FILE "
                                   "--probe SHAPE --world N`)";
    if (!plan.divide.empty()) throw PlanError(plan.divide_loc, msg);
    throw Error(msg);
  }
  if (v->plan_yaml != plan.to_yaml() || v->world_size != world_size)
    throw Error(head + "; ScriptOptions::verified is of another plan or world size (" + std::to_string(v->world_size) +
                " ranks): verify this plan at " + std::to_string(world_size));
  if (!v->passed()) throw Error(head + "; the verification failed:\n" + v->str());
  double worst = 0;
  for (const auto& o : v->outputs) worst = std::max(worst, o.max_diff);
  warnings.push_back("traced module: verified at " + std::to_string(world_size) + " ranks in " + v->dtype +
                     " (largest output difference " + c10::str(worst) + ")");
}

// A method left out of ScriptOptions::methods runs on the shards with its
// graph unchanged: one that reads a split parameter would compute with this
// rank's slice as if it were whole, silently. Checked on an inlined copy, so
// the method itself is left as it is.
void refuse_unnamed_readers(const Module& clone, const std::vector<std::string>& named, const Decisions& d) {
  for (const auto& method : clone.get_methods()) {
    const std::string& name = method.name();
    if (name.rfind("__", 0) == 0 || std::find(named.begin(), named.end(), name) != named.end()) continue;
    std::shared_ptr<Graph> g = method.graph()->copy();
    try {
      script_detail::inline_calls(*g, name);
    } catch (const Error&) {
      // What cannot be inlined is not searched; the reads in the graph still are.
    }
    for (Node* n : script_detail::all_nodes(g->block())) {
      if (n->kind() != torch::jit::prim::GetAttr) continue;
      const auto path = script_detail::attr_path(n->output(), g->inputs()[0]);
      const auto it = path ? d.by_path.find(*path) : d.by_path.end();
      if (it == d.by_path.end() || !d.params[it->second].split) continue;
      // The read's own source is often lost in inlining; its first user's is the op's line.
      std::string at = script_detail::where(n);
      if (at == "<unknown source>" && !n->output()->uses().empty()) at = script_detail::where(n->output()->uses()[0].user);
      script_detail::fail(d.params[it->second],
                          "method '" + name + "' reads it (" + at + ") but is not rewritten, so it would run on this "
                          "rank's shard as if it were whole; name it in ScriptOptions::methods");
    }
  }
}

// What a plan can ask of shardplan::nn layers (their plugins read it) that the
// graph rewrite does not do: ignoring it would train without it silently.
void refuse_layer_only_keys(const Plan& plan) {
  if (plan.sequence_parallel.enabled)
    throw PlanError(plan.sequence_parallel.loc,
                    "sequence_parallel applies to shardplan::nn models; parallelize_script does not split "
                    "TorchScript activations along the sequence (docs/TORCHSCRIPT.md, Limits)");
  for (const Rule& rule : plan.rules)
    for (const char* key : {"overlap", "head_dim", "replicate_heads", "sequence_dim", "sequence_parallel", "plugin"})
      if (const RuleOption* o = rule.option(key))
        throw PlanError(o->loc, std::string("'") + key + "' is read by the layer plugins of shardplan::nn models; "
                                "the TorchScript rewrite does not support it (docs/TORCHSCRIPT.md, Limits)");
}

ScriptParallel parallelize(const Module& module, const Plan& plan, World& world, const ScriptOptions& options,
                           bool verifying) {
  refuse_layer_only_keys(plan);
  const Mesh mesh = plan.resolve_mesh(world.size());
  // Groups first and outside the lock: making one is collective.
  ScriptParallel out;
  std::map<std::string, int64_t> group_ids;
  for (const auto& axis : mesh.axes()) {
    out.groups[axis.first] = world.group(mesh, axis.first);
    group_ids[axis.first] = script_detail::register_group(out.groups[axis.first]);
  }
  std::lock_guard<std::mutex> lock(script_detail::jit_mutex());
  Module clone = clone_unrun(module);
  std::vector<ParamInfo> infos;
  for (const auto& p : module.named_parameters()) infos.push_back({p.name, p.value.sizes().vec()});
  const PlanMatch match = plan.assign(infos, world.size());
  std::vector<std::shared_ptr<Graph>> graphs;
  for (const auto& name : options.methods) graphs.push_back(script_detail::inlined_graph(clone, name));
  Decisions d = inventory(module, match);
  script_detail::decide(d, graphs, mesh, world.rank());
  refuse_unnamed_readers(clone, options.methods, d);
  std::optional<std::string> traced;
  for (const auto& g : graphs)
    if (!traced) traced = script_detail::traced_at(*g);
  std::vector<std::string> warnings = match.warnings;
  if (traced && !verifying) require_verified(plan, world.size(), d, *traced, options, warnings);
  divide_attributes(plan, mesh, clone, graphs, traced.has_value(), warnings);
  if (!traced) check_head_sizes(plan, module, clone, d, graphs);
  replace_parameters(clone, d);
  script_detail::rewrite(d, group_ids, mesh, world.rank());
  for (const auto& g : graphs) g->lint();

  out.module = std::make_shared<Module>(clone);
  out.report.mesh = mesh;
  out.report.rank = world.rank();
  out.report.world_size = world.size();
  out.report.warnings = warnings;
  out.report.plan_yaml = plan.to_yaml();
  script_detail::fill_report(out.report, clone, d);
  return out;
}

}  // namespace

Communicator& ScriptParallel::group_of(const std::string& path) const {
  for (const ReportRow& row : report.rows)
    if (row.path == path) {
      if (row.splits.empty())
        throw Error("ScriptParallel::group_of: parameter '" + path + "' is not split by the plan (" + row.layout +
                    "), so no axis group holds its pieces");
      return *groups.at(row.splits.front().axis);
    }
  throw Error("ScriptParallel::group_of: the module has no parameter '" + path + "'");
}

ScriptParallel parallelize_script(const Module& module, const Plan& plan, World& world, const ScriptOptions& options) {
  return parallelize(module, plan, world, options, false);
}

ScriptParallel script_detail::parallelize_unverified(const Module& module, const Plan& plan, World& world,
                                                     const ScriptOptions& options) {
  return parallelize(module, plan, world, options, true);
}

std::vector<at::Tensor> unique_parameters(const Module& module) {
  std::vector<at::Tensor> out;
  for (const auto& p : module.parameters())
    if (std::none_of(out.begin(), out.end(), [&](const at::Tensor& q) { return q.is_same(p); })) out.push_back(p);
  return out;
}

// A pipe or device would block the reader, or be read without end.
Module load_script_module(const std::string& file) {
  std::error_code ec;
  const auto st = std::filesystem::status(file, ec);
  if (!std::filesystem::exists(st)) throw Error("TorchScript file '" + file + "' not found");
  if (!std::filesystem::is_regular_file(st))
    throw Error("TorchScript file '" + file + "' is not a regular file");
  try {
    return torch::jit::load(file);
  } catch (const std::exception& e) {
    const std::string why = e.what();
    throw Error("'" + file + "' is not a TorchScript module (torch.jit.save): " + why.substr(0, why.find('\n')));
  }
}

std::vector<std::pair<std::string, at::Tensor>> script_state_dict(const Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : module.named_parameters()) out.emplace_back(p.name, p.value.detach());
  for (const auto& b : module.named_buffers()) out.emplace_back(b.name, b.value.detach());
  return out;
}

void load_script_state_dict(Module& module, const std::vector<std::pair<std::string, at::Tensor>>& state) {
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  at::NoGradGuard no_grad;
  auto copy = [&](const std::string& name, at::Tensor dst) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw Error("state dict has no '" + name + "'");
    if (it->second.sizes() != dst.sizes())
      throw Error("state dict: '" + name + "' has shape " + c10::str(it->second.sizes()) + ", the module's is " +
                  c10::str(dst.sizes()));
    dst.copy_(it->second);
  };
  for (const auto& p : module.named_parameters()) copy(p.name, p.value);
  for (const auto& b : module.named_buffers()) copy(b.name, b.value);
}

}  // namespace shardplan
