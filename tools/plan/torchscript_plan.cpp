// A plan for a TorchScript module (torch.jit.script / torch.jit.trace, then
// torch.jit.save): its forward graph, inlined, is what the probe of
// auto_plan sees for a C++ model (constants propagated, so that the
// branches of functional wrappers fold away). prim::GetAttr chains from `self` name the
// parameters each aten::linear / conv / embedding reads; walking a layer's
// input back through elementwise ops finds the layers that feed it, and the
// uses of every value on the way say whether anything else reads them. A
// pair is made only when nothing else does (as auto_plan_probe.cpp decides
// from autograd's graph); anything else stays replicated with the reason.
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/script.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "shardplan/error.h"
#include "shardplan/script.h"
#include "torchscript_plan.h"

namespace shardplan_plan {
namespace {

using torch::jit::Node;
using torch::jit::Value;

struct Layer {
  Node* node = nullptr;
  std::string kind;     // "Linear", "Conv", "Embedding"
  std::string name;     // the module path: the weight's path without ".weight"
  std::string weight, bias;
  int64_t width = 0;    // weight.size(0): out_features, out_channels
  int64_t groups = 1;
};

const std::set<std::string> kUnary = {
    "relu",  "relu_",    "gelu",  "silu",       "tanh",       "sigmoid", "elu",         "leaky_relu", "hardtanh",
    "relu6", "softplus", "mish",  "hardswish",  "hardsigmoid", "neg",    "dropout",     "feature_dropout",
    "alpha_dropout", "square", "pow", "clamp", "abs", "exp", "contiguous", "detach"};
const std::set<std::string> kBinary = {"add", "sub", "mul", "div"};
const std::set<std::string> kPooling = {"max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d",
                                        "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
                                        "adaptive_avg_pool3d", "upsample_nearest2d", "upsample_bilinear2d"};

bool is_tensor(const Value* v) { return v->type()->kind() == c10::TypeKind::TensorType; }
std::string op_name(const Node* n) {
  const std::string q = n->kind().toQualString();
  return q.rfind("aten::", 0) == 0 ? q.substr(6) : q;
}

int64_t int_arg(const Node* n, size_t i, int64_t fallback) {
  if (i >= n->inputs().size()) return fallback;
  auto v = torch::jit::toIValue(n->input(i));
  return v && v->isInt() ? v->toInt() : fallback;
}

class Graph {
 public:
  Graph(const torch::jit::Module& m, std::shared_ptr<torch::jit::Graph> g) : graph_(std::move(g)) {
    for (const auto& p : m.named_parameters(true)) shapes_[p.name] = p.value.sizes().vec();
    paths_[graph_->inputs()[0]] = "";
    scan(graph_->block());
  }
  std::vector<Layer>& layers() { return layers_; }
  const std::map<std::string, std::vector<int64_t>>& shapes() const { return shapes_; }
  int uses(const std::string& param) const { return uses_.count(param) ? uses_.at(param) : 0; }
  const std::string* path(const Value* v) const {
    auto it = paths_.find(v);
    return it == paths_.end() ? nullptr : &it->second;
  }
  Layer* layer_of(const Node* n) {
    for (Layer& l : layers_)
      if (l.node == n) return &l;
    return nullptr;
  }
  bool top_level(const Node* n) const { return n->owningBlock() == graph_->block(); }

 private:
  void scan(torch::jit::Block* block) {
    for (Node* n : block->nodes()) {
      if (n->kind() == c10::prim::GetAttr) {
        auto in = paths_.find(n->input(0));
        if (in != paths_.end()) paths_[n->output()] = in->second.empty() ? n->s(c10::attr::name) : in->second + "." + n->s(c10::attr::name);
        continue;
      }
      for (const Value* v : n->inputs()) {
        const std::string* p = path(v);
        if (p && shapes_.count(*p)) ++uses_[*p];
      }
      add_layer(n);
      for (torch::jit::Block* b : n->blocks()) scan(b);
    }
  }
  void add_layer(Node* n) {
    const std::string op = op_name(n);
    Layer l;
    l.node = n;
    size_t w = 1, b = 2;
    if (op == "linear") l.kind = "Linear";
    else if (op == "conv1d" || op == "conv2d" || op == "conv3d") l.kind = "Conv", l.groups = int_arg(n, 6, 1);
    else if (op == "_convolution" && int_arg(n, 6, 1) == 0) l.kind = "Conv", l.groups = int_arg(n, 8, 1);
    else if (op == "embedding") l.kind = "Embedding", w = 0, b = 99;
    else return;
    const std::string* wp = w < n->inputs().size() ? path(n->input(w)) : nullptr;
    if (!wp || !shapes_.count(*wp)) return;  // a weight computed in forward: not a parameter to cut
    l.weight = *wp;
    const std::string* bp = b < n->inputs().size() ? path(n->input(b)) : nullptr;
    if (bp && shapes_.count(*bp)) l.bias = *bp;
    const size_t dot = l.weight.rfind('.');
    l.name = dot == std::string::npos ? l.weight : l.weight.substr(0, dot);
    l.width = shapes_[l.weight].at(0);
    layers_.push_back(l);
  }

  std::shared_ptr<torch::jit::Graph> graph_;
  std::map<std::string, std::vector<int64_t>> shapes_;
  std::map<const Value*, std::string> paths_;
  std::map<std::string, int> uses_;
  std::vector<Layer> layers_;
};

// Which layers feed `b` through elementwise ops only, read by nothing else.
struct Feed {
  std::vector<Layer*> producers;
  std::set<std::string> ops;
  std::string why_not;       // for b
  // Producers found, whose output something else reads too: they stay
  // replicated for that reason.
  std::vector<Layer*> held_back;
  std::string held_back_why;
};

Feed feed(Graph& g, const Layer& b) {
  Feed f;
  const bool conv = b.kind == "Conv";
  std::vector<Value*> todo = {b.node->input(b.kind == "Embedding" ? 1 : 0)};
  std::set<const Node*> chain = {b.node};
  std::vector<Value*> values;
  while (!todo.empty() && f.why_not.empty()) {
    Value* v = todo.back();
    todo.pop_back();
    values.push_back(v);
    Node* n = v->node();
    const std::string op = op_name(n);
    if (Layer* a = g.layer_of(n)) {
      if (a->kind != b.kind)
        f.why_not = "its input comes (in part) from " + a->name + (a->kind == "Embedding" ? ", an " : ", a ") + a->kind;
      else if (std::find(f.producers.begin(), f.producers.end(), a) == f.producers.end()) f.producers.push_back(a);
      continue;
    }
    if (n->kind() == c10::prim::Param) {
      f.why_not = "its input is (also) the model's input";
    } else if (n->kind() == c10::prim::GetAttr) {
      f.why_not = "its input is combined with the parameter " + (g.path(v) ? *g.path(v) : std::string("?")) + ", read whole";
    } else if (kUnary.count(op) || kBinary.count(op) || (conv && kPooling.count(op))) {
      chain.insert(n);
      f.ops.insert(op);
      for (Value* in : n->inputs())
        if (is_tensor(in)) todo.push_back(in);
    } else {
      f.why_not = "its input passes through " + std::string(n->kind().toQualString()) +
                  ", not known to keep a split activation split";
    }
  }
  // In graph order, as the layers ran (gate before up).
  std::sort(f.producers.begin(), f.producers.end());
  if (!f.why_not.empty() || f.producers.empty()) {
    if (f.why_not.empty()) f.why_not = "its input is not computed from another layer";
    f.producers.clear();
    return f;
  }
  for (Value* v : values)
    for (const auto& use : v->uses())
      if (!chain.count(use.user)) {
        f.why_not = "a value on the way from " + f.producers[0]->name + " is also read by " +
                    std::string(use.user->kind().toQualString()) + ", which needs it whole";
        f.held_back_why = "its pair with " + b.name + " is refused: " + f.why_not;
        f.held_back.swap(f.producers);
        return f;
      }
  return f;
}

std::string join(const std::set<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

// Pairs in graph order, greedily (fc1 -> fc2 -> fc3 pairs fc1 with fc2), as
// auto_plan does; `reasons` gets why each other layer stays replicated.
class Pairing {
 public:
  Pairing(Graph& g, const std::string& axis) : g_(g), axis_(axis) {}

  std::vector<shardplan::AutoPlanUnit> units(std::map<std::string, std::string>& reasons) {
    for (Layer& b : g_.layers())
      if (b.kind != "Embedding") pair(b);
    for (Layer& l : g_.layers()) {
      if (claimed_.count(&l)) continue;
      if (l.kind == "Embedding")
        note(l, "a vocab-parallel embedding is planned only with an LM head and its loss module, which a "
                "TorchScript graph does not have");
      else
        note(l, "not the first or second half of a pair");
      reasons[l.name] = reasons_[&l];
    }
    return units_;
  }

 private:
  void note(const Layer& l, const std::string& why) { reasons_.emplace(&l, why); }

  bool usable(const Layer& l) {
    if (!g_.top_level(l.node)) return note(l, "it runs inside a loop or a branch of the graph"), false;
    for (const std::string& p : {l.weight, l.bias})
      if (!p.empty() && g_.uses(p) > 1)
        return note(l, p + " is read by " + std::to_string(g_.uses(p)) + " operations (a tied or reused parameter)"),
               false;
    if (l.kind == "Conv" && l.groups != 1) return note(l, "grouped convolution"), false;
    return true;
  }

  void pair(Layer& b) {
    if (claimed_.count(&b) || !usable(b)) return;
    Feed f = feed(g_, b);
    // The refused pair explains a producer better than its own input did.
    for (Layer* a : f.held_back) reasons_[a] = f.held_back_why;
    if (f.producers.empty()) return note(b, f.why_not);
    for (Layer* a : f.producers) {
      if (claimed_.count(a)) return note(b, "its producer " + a->name + " is already sharded in another pair");
      if (!usable(*a)) return note(b, "its producer " + a->name + " cannot be sharded");
      if (a->width != f.producers[0]->width) return note(b, "its producers differ in width");
    }
    const bool conv = b.kind == "Conv";
    const std::string via = f.ops.empty() ? "directly" : "through " + join(f.ops);
    shardplan::AutoPlanUnit u;
    std::set<std::string> names;
    for (Layer* a : f.producers) {
      names.insert(a->name);
      u.layers.push_back(a->name);
      u.rules.push_back({a->weight, layout(g_.shapes().at(a->weight).size(), 0), {{"output", "sharded"}},
                         std::string(conv ? "output-channel" : "column") + "-parallel " + a->name +
                             ", output left split: only " + b.name + " reads it (" + via +
                             ", in the TorchScript forward graph)"});
      if (!a->bias.empty()) u.rules.push_back({a->bias, layout(1, 0), {}, "follows " + a->name + "'s outputs"});
    }
    u.layers.push_back(b.name);
    u.rules.push_back({b.weight, layout(g_.shapes().at(b.weight).size(), 1), {{"input", "sharded"}},
                       std::string(conv ? "input-channel" : "row") + "-parallel " + b.name + ": reads the split output of " +
                           join(names) + "; its partial sums are all-reduced once (the bias, replicated, after)"});
    for (Layer* a : f.producers) claimed_.insert(a);
    claimed_.insert(&b);
    units_.push_back(std::move(u));
  }

  shardplan::Layout layout(size_t rank, size_t dim) const {
    shardplan::Layout l(rank);
    l[dim] = axis_;
    return l;
  }

  Graph& g_;
  std::string axis_;
  std::set<const Layer*> claimed_;
  std::map<const Layer*, std::string> reasons_;
  std::vector<shardplan::AutoPlanUnit> units_;
};

}  // namespace

FilePlan plan_torchscript(const std::string& file, int world_size, const shardplan::AutoPlanOptions& options) {
  torch::jit::Module m = shardplan::load_script_module(file);
  if (!m.find_method("forward"))
    throw shardplan::Error("'" + file + "' has no forward method: a TorchScript module saved with torch.jit.save is "
                           "needed (a torch::save state dict goes to --state-dict)");
  auto graph = m.get_method("forward").graph()->copy();
  torch::jit::Inline(*graph);
  // Functional wrappers (F.silu's `if inplace:`) leave branches on constants.
  torch::jit::ConstantPropagation(graph);
  Graph g(m, graph);
  std::map<std::string, std::string> reasons;
  const auto units = Pairing(g, options.axis).units(reasons);
  std::vector<std::string> lines;
  for (const auto& [name, why] : reasons) lines.push_back(name + ": " + why);
  lines.push_back("(only aten::linear, convolution and embedding ops are read; what else has parameters, such as "
                  "attention or norms, stays replicated)");
  FilePlan out;
  std::vector<shardplan::ParamInfo> infos;
  for (const auto& p : m.named_parameters(true)) {
    infos.push_back({p.name, p.value.sizes().vec()});
    out.params.push_back({p.name, p.value.sizes().vec(), static_cast<int64_t>(p.value.element_size())});
  }
  out.plan = shardplan::auto_plan_for_units(infos, units, lines, world_size, options,
                                            "from the forward graph of TorchScript file " + file);
  return out;
}

}  // namespace shardplan_plan
