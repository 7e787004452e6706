// The probe behind auto_plan: which shardable layers a model has, and who
// feeds whom, read from the autograd graph of one recorded forward.
//
// C++ modules have no forward hooks, but every shardable layer calls its
// strategy; a recording strategy computes exactly what the layer computes
// unsharded and keeps the call's input and output. The graph then answers
// the two questions a Megatron pair needs: is B's input made from A's output
// by elementwise operations only (walking B's input's grad_fn back), and
// does anything but that chain read A's output (the graph's consumers, built
// once from the probe's result)? Autograd's node names ("GeluBackward0") are
// what identifies an operation; an unknown one makes the planner unsure,
// which is safe: the layers stay replicated.
#include "auto_plan_probe.h"

#include <ATen/Functions.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <unordered_map>
#include <unordered_set>

#include "shardplan/error.h"
#include "shardplan/nn/conv.h"
#include "shardplan/nn/cross_entropy.h"
#include "shardplan/nn/deferred_init.h"
#include "shardplan/nn/embedding.h"
#include "shardplan/nn/linear.h"
#include "shardplan/nn/lstm.h"
#include "shardplan/nn/multihead_attention.h"

namespace shardplan {
namespace auto_detail {

using torch::autograd::Node;

std::string Layer::name() const { return paths.empty() || paths[0].empty() ? "(root)" : paths[0]; }

namespace {

void record(Layer& layer, const at::Tensor& input, const at::Tensor& output) {
  if (layer.calls++ == 0) {
    layer.input = input;
    layer.output = output;
  } else {
    layer.later_outputs.push_back(output);
  }
}

class LinearRecorder : public nn::LinearStrategy {
 public:
  explicit LinearRecorder(Layer& layer) : layer_(layer) {}
  at::Tensor forward(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias) override {
    at::Tensor out = at::linear(input, weight, bias);
    record(layer_, input, out);
    return out;
  }
  std::string describe() const override { return "auto_plan probe"; }

 private:
  Layer& layer_;
};

class ConvRecorder : public nn::ConvStrategy {
 public:
  explicit ConvRecorder(Layer& layer) : layer_(layer) {}
  at::Tensor forward(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                     const nn::ConvFunction& conv) override {
    at::Tensor out = conv(input, weight, bias, layer_.groups);
    record(layer_, input, out);
    return out;
  }
  std::string describe() const override { return "auto_plan probe"; }

 private:
  Layer& layer_;
};

// The loss's own computation is the module's: step aside for the call.
class CrossEntropyRecorder : public nn::CrossEntropyStrategy,
                             public std::enable_shared_from_this<CrossEntropyRecorder> {
 public:
  CrossEntropyRecorder(Layer& layer, nn::CrossEntropyLossImpl& module) : layer_(layer), module_(module) {}
  at::Tensor forward(const at::Tensor& input, const at::Tensor& target,
                     const torch::nn::CrossEntropyLossOptions&) override {
    auto self = shared_from_this();
    module_.set_strategy(nullptr);
    at::Tensor out;
    try {
      out = module_.forward(input, target);
    } catch (...) {
      module_.set_strategy(self);
      throw;
    }
    module_.set_strategy(self);
    record(layer_, input, out);
    return out;
  }
  std::string describe() const override { return "auto_plan probe"; }

 private:
  Layer& layer_;
  nn::CrossEntropyLossImpl& module_;
};

template <class Impl>
bool has_strategy(torch::nn::Module* m) {
  auto* t = dynamic_cast<Impl*>(m);
  return t && t->strategy();
}

// "torch::autograd::generated::GeluBackward0" or "GeluBackward0" -> "GeluBackward0";
// a custom function's "torch::autograd::CppNode<shardplan::gelu_detail::GeluKeepingSlope>"
// -> "GeluKeepingSlope".
std::string base_name(const std::string& op) {
  const std::string name = !op.empty() && op.back() == '>' ? op.substr(0, op.size() - 1) : op;
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

bool in(const std::string& op, std::initializer_list<const char*> names) {
  const std::string b = base_name(op);
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return b == n; });
}

}  // namespace

bool is_elementwise_unary(const std::string& op) {
  return in(op, {"ReluBackward0",        "GeluBackward0",        "TanhBackward0",       "SigmoidBackward0",
                 "SiluBackward0",        "EluBackward0",         "CeluBackward0",       "LeakyReluBackward0",
                 "HardtanhBackward0",    "SoftplusBackward0",    "SoftshrinkBackward0", "HardshrinkBackward0",
                 "MishBackward0",        "HardswishBackward0",   "HardsigmoidBackward0", "ThresholdBackward0",
                 "LogSigmoidBackward0",  "NegBackward0",         "ExpBackward0",        "Expm1Backward0",
                 "LogBackward0",         "Log1PBackward0",       "SqrtBackward0",       "RsqrtBackward0",
                 "AbsBackward0",         "SinBackward0",         "CosBackward0",        "ErfBackward0",
                 "ReciprocalBackward0",  "ClampBackward1",       "ClampMinBackward0",   "ClampMaxBackward0",
                 "PowBackward0",         "CloneBackward0",       "MulBackward1",        "DivBackward1",
                 "AddBackward1",         "SubBackward1",         "RsubBackward1",       "NativeDropoutBackward0",
                 "FusedDropoutBackward0", "GeluKeepingSlope"});
}

bool is_elementwise_binary(const std::string& op) {
  return in(op, {"AddBackward0", "SubBackward0", "MulBackward0", "DivBackward0", "MaximumBackward0",
                 "MinimumBackward0"});
}

bool is_channel_preserving(const std::string& op) {
  return in(op, {"MaxPool2DWithIndicesBackward0", "MaxPool3DWithIndicesBackward0", "AvgPool2DBackward0",
                 "AvgPool3DBackward0", "AdaptiveAvgPool2DBackward0", "AdaptiveAvgPool3DBackward0",
                 "AdaptiveMaxPool2DBackward0", "AdaptiveMaxPool3DBackward0", "UpsampleNearest2DBackward0",
                 "UpsampleBilinear2DBackward0"});
}

bool is_view(const std::string& op) {
  return in(op, {"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0"});
}

bool is_attention_op(const std::string& op) {
  return is_view(op) || is_elementwise_unary(op) || is_elementwise_binary(op) ||
         in(op, {"TransposeBackward0", "TransposeBackward1", "TBackward0", "PermuteBackward0", "ExpandBackward0",
                 "BmmBackward0", "MmBackward0", "SoftmaxBackward0", "SliceBackward0", "CatBackward0",
                 "IndexSelectBackward0", "RepeatBackward0", "UnsqueezeBackward0", "SqueezeBackward0",
                 "SqueezeBackward1", "MaskedFillBackward0", "WhereBackward0", "ToCopyBackward0"});
}

std::string op_short(const std::string& op) {
  std::string b = base_name(op);
  const size_t back = b.find("Backward");
  if (back != std::string::npos) b = b.substr(0, back);
  std::string out;
  for (size_t i = 0; i < b.size(); ++i) {
    const char c = b[i];
    if (std::isupper(static_cast<unsigned char>(c))) {
      // "LeakyRelu" -> "leaky_relu", "MaxPool2DWithIndices" -> "max_pool2d_with_indices"
      if (i > 0 && !std::isupper(static_cast<unsigned char>(b[i - 1])) && !std::isdigit(static_cast<unsigned char>(b[i - 1])))
        out += '_';
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out.empty() ? base_name(op) : out;
}

struct ProbeGraph::Recording {
  std::vector<std::shared_ptr<void>> keep;  // the recorders, alive while installed
};

ProbeGraph::ProbeGraph(torch::nn::Module& model) : model_(model) {
  std::unordered_map<torch::nn::Module*, size_t> index;
  std::unordered_set<torch::nn::Module*> attention_children;
  for (const auto& item : model.named_modules()) {
    torch::nn::Module* m = item.value().get();
    if (has_strategy<nn::LinearImpl>(m) || has_strategy<nn::Conv1dImpl>(m) || has_strategy<nn::Conv2dImpl>(m) ||
        has_strategy<nn::Conv3dImpl>(m) || has_strategy<nn::EmbeddingImpl>(m) ||
        has_strategy<nn::MultiheadAttentionImpl>(m) || has_strategy<nn::LSTMImpl>(m) ||
        has_strategy<nn::CrossEntropyLossImpl>(m))
      throw Error("auto_plan: module '" + item.key() +
                  "' is already sharded (it has a parallel strategy); plan the model before parallelize()");
    auto found = index.find(m);
    if (found != index.end()) {
      layers_[found->second].paths.push_back(item.key());
      continue;
    }
    Layer l;
    if (auto* lin = dynamic_cast<nn::LinearImpl*>(m)) {
      l.kind = Kind::Linear;
      l.width = lin->options.out_features();
    } else if (auto* c1 = dynamic_cast<nn::Conv1dImpl*>(m)) {
      l.kind = Kind::Conv, l.width = c1->options.out_channels(), l.groups = c1->options.groups();
    } else if (auto* c2 = dynamic_cast<nn::Conv2dImpl*>(m)) {
      l.kind = Kind::Conv, l.width = c2->options.out_channels(), l.groups = c2->options.groups();
    } else if (auto* c3 = dynamic_cast<nn::Conv3dImpl*>(m)) {
      l.kind = Kind::Conv, l.width = c3->options.out_channels(), l.groups = c3->options.groups();
    } else if (auto* e = dynamic_cast<nn::EmbeddingImpl*>(m)) {
      l.kind = Kind::Embedding, l.width = e->options.num_embeddings();
    } else if (auto* a = dynamic_cast<nn::MultiheadAttentionImpl*>(m)) {
      l.kind = Kind::Attention;
      for (const auto& child : a->modules(/*include_self=*/false)) attention_children.insert(child.get());
    } else if (dynamic_cast<nn::LSTMImpl*>(m)) {
      l.kind = Kind::LSTM;
    } else if (dynamic_cast<nn::CrossEntropyLossImpl*>(m)) {
      l.kind = Kind::CrossEntropy;
    } else {
      continue;
    }
    l.module = m;
    l.paths.push_back(item.key());
    for (const auto& p : m->named_parameters(/*recurse=*/true))
      l.params.emplace_back(p.key(), p.value().sizes().vec());
    index[m] = layers_.size();
    layers_.push_back(std::move(l));
  }
  for (Layer& l : layers_) l.inside_attention = attention_children.count(l.module) > 0;
}

ProbeGraph::~ProbeGraph() = default;

void ProbeGraph::run(const std::function<at::Tensor(torch::nn::Module&)>& probe) {
  rec_ = std::make_unique<Recording>();
  // Install, run, and restore whatever happens: the caller's model must come
  // back exactly as it was.
  std::vector<std::pair<torch::nn::Module*, bool>> training;
  for (const auto& m : model_.modules()) training.emplace_back(m.get(), m->is_training());
  auto restore = [&] {
    for (Layer& l : layers_) {
      if (auto* lin = dynamic_cast<nn::LinearImpl*>(l.module)) lin->set_strategy(nullptr);
      if (auto* c1 = dynamic_cast<nn::Conv1dImpl*>(l.module)) c1->set_strategy(nullptr);
      if (auto* c2 = dynamic_cast<nn::Conv2dImpl*>(l.module)) c2->set_strategy(nullptr);
      if (auto* c3 = dynamic_cast<nn::Conv3dImpl*>(l.module)) c3->set_strategy(nullptr);
      if (auto* ce = dynamic_cast<nn::CrossEntropyLossImpl*>(l.module)) ce->set_strategy(nullptr);
    }
    // Module::train recurses, so parents first and each child after: every
    // module ends with its own flag.
    for (const auto& [m, on] : training) m->train(on);
  };
  for (Layer& l : layers_) {
    if (l.kind == Kind::Linear && !l.inside_attention) {
      auto r = std::make_shared<LinearRecorder>(l);
      rec_->keep.push_back(r);
      dynamic_cast<nn::LinearImpl*>(l.module)->set_strategy(r);
    } else if (l.kind == Kind::Conv) {
      auto r = std::make_shared<ConvRecorder>(l);
      rec_->keep.push_back(r);
      if (auto* c1 = dynamic_cast<nn::Conv1dImpl*>(l.module)) c1->set_strategy(r);
      if (auto* c2 = dynamic_cast<nn::Conv2dImpl*>(l.module)) c2->set_strategy(r);
      if (auto* c3 = dynamic_cast<nn::Conv3dImpl*>(l.module)) c3->set_strategy(r);
    } else if (l.kind == Kind::CrossEntropy) {
      auto* ce = dynamic_cast<nn::CrossEntropyLossImpl*>(l.module);
      auto r = std::make_shared<CrossEntropyRecorder>(l, *ce);
      rec_->keep.push_back(r);
      ce->set_strategy(r);
    }
  }
  // Eval mode: dropout is the identity then, so it does not hide what feeds
  // what (it is elementwise and would be allowed anyway).
  model_.eval();
  try {
    c10::AutoGradMode grad(true);
    // A model built under DeferredInit (weights to come from a file) is
    // probed as it is: its graph does not depend on the values.
    nn::ReadDeferred graph_only;
    root_ = probe(model_);
  } catch (const std::exception& e) {
    restore();
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    throw Error("auto_plan: the probe forward failed: " + what);
  }
  restore();
  if (!root_.defined()) throw Error("auto_plan: the probe returned an undefined tensor");

  std::vector<Layer*> called;
  for (Layer& l : layers_)
    if (l.calls > 0) called.push_back(&l);
  // Probe order: a layer's output node was made after its input's, and
  // autograd numbers nodes in creation order.
  std::stable_sort(called.begin(), called.end(), [](const Layer* a, const Layer* b) {
    const auto& na = a->output.grad_fn();
    const auto& nb = b->output.grad_fn();
    const uint64_t sa = na ? na->sequence_nr() : UINT64_MAX, sb = nb ? nb->sequence_nr() : UINT64_MAX;
    return sa < sb;
  });
  first_called_ = called;

  // Which layer made each output node, every call's.
  made_by_.clear();
  for (Layer& l : layers_) {
    if (l.calls > 0 && l.output.defined() && l.output.grad_fn()) made_by_[l.output.grad_fn().get()] = &l;
    for (const auto& out : l.later_outputs)
      if (out.defined() && out.grad_fn()) made_by_[out.grad_fn().get()] = &l;
  }

  // Who reads each node's outputs, over the whole graph of the result.
  consumers_.clear();
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  if (Node* r = root_.grad_fn().get()) stack.push_back(r), seen.insert(r);
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& edge : n->next_edges()) {
      Node* next = edge.function.get();
      if (!next) continue;
      consumers_[next].push_back(n);
      if (seen.insert(next).second) stack.push_back(next);
    }
  }
}

std::vector<Layer*> ProbeGraph::call_order() {
  std::vector<Layer*> out = first_called_;
  for (Layer& l : layers_)
    if (l.calls == 0) out.push_back(&l);
  return out;
}

namespace {

// Back from a consumer's input to the layers whose outputs make it, through
// allowed operations only; on the first thing that is not so, f.why_not.
class ChainWalk {
 public:
  ChainWalk(const std::map<Node*, Layer*>& made_by, Kind kind, const std::function<bool(const std::string&)>& allowed,
            Feed& f, bool constants = false)
      : made_by_(made_by), kind_(kind), allowed_(allowed), f_(f), constants_(constants) {}

  bool walk(Node* n, uint32_t nr) {
    if (!n) {
      f_.why_not = "part of its input is not computed from another layer's output";
      return false;
    }
    auto made = made_by_.find(n);
    if (made != made_by_.end()) return producer(n, nr, made->second);
    if (done_.count(n)) return true;
    const std::string op = n->name();
    if (!allowed_(op)) {
      f_.why_not = "its input passes through " + op_short(op) + ", which does not keep a split activation split";
      return false;
    }
    for (const auto& e : n->next_edges())
      if (!e.is_valid() && !constants_) {
        f_.why_not = "its input is combined by " + op_short(op) + " with a tensor that is not a layer's output";
        return false;
      }
    if (n->next_edges().empty()) {
      f_.why_not = "its input comes from " + op_short(op) + " of no layer";
      return false;
    }
    chain.insert(n);
    done_.insert(n);
    const std::string s = op_short(op);
    if (std::find(ops.begin(), ops.end(), s) == ops.end()) ops.push_back(s);
    for (const auto& e : n->next_edges())
      if (e.is_valid() && !walk(e.function.get(), e.input_nr)) return false;
    return true;
  }

  std::unordered_set<Node*> chain;  // the nodes between the producers' outputs and the input, both included
  std::vector<std::string> ops;     // reverse graph order

 private:
  bool producer(Node* n, uint32_t nr, Layer* p) {
    if (p->calls != 1) {
      f_.why_not = "its producer " + p->name() + " runs " + std::to_string(p->calls) + " times in the probe";
      return false;
    }
    if (static_cast<int64_t>(nr) != p->output.output_nr()) {
      f_.why_not = "it reads a different output of " + p->name();
      return false;
    }
    if (p->kind != kind_ || p->inside_attention) {
      f_.why_not = "it reads the output of " + p->name() + ", a layer of another kind";
      return false;
    }
    chain.insert(n);
    if (std::find(f_.producers.begin(), f_.producers.end(), p) == f_.producers.end()) f_.producers.push_back(p);
    return true;
  }

  const std::map<Node*, Layer*>& made_by_;
  Kind kind_;
  const std::function<bool(const std::string&)>& allowed_;
  Feed& f_;
  bool constants_;  // operands that need no gradient (masks, rotary tables) are allowed
  std::unordered_set<Node*> done_;
};

// The nodes back from `from` (included), stopping at `stop` and after
// `depth` steps. For a layer's own computation, from its output to its
// input's side: bounded, a layer's own computation is a few nodes.
std::unordered_set<Node*> nodes_back_from(Node* from, const std::function<bool(Node*)>& stop, int depth = INT_MAX) {
  std::unordered_set<Node*> own;
  std::vector<std::pair<Node*, int>> todo{{from, 0}};
  while (!todo.empty()) {
    auto [n, d] = todo.back();
    todo.pop_back();
    if (!n || stop(n) || !own.insert(n).second || d > depth) continue;
    for (const auto& e : n->next_edges()) todo.emplace_back(e.function.get(), d + 1);
  }
  return own;
}

std::unordered_set<Node*> own_nodes(const at::Tensor& output, const std::function<bool(Node*)>& stop, int depth) {
  if (!output.defined() || !output.grad_fn()) return {};
  return nodes_back_from(output.grad_fn().get(), stop, depth);
}

}  // namespace

Feed ProbeGraph::feed(const Layer& consumer, Kind producer_kind,
                      const std::function<bool(const std::string&)>& allowed_op, bool constants) {
  Feed f;
  if (!probed()) {
    f.why_not = "no probe forward was given, so who feeds it is unknown";
    return f;
  }
  Node* start = consumer.input.defined() ? consumer.input.grad_fn().get() : nullptr;
  if (consumer.calls != 1) {
    f.why_not = consumer.calls == 0 ? "it did not run in the probe"
                                    : "it runs " + std::to_string(consumer.calls) + " times in the probe";
    // Its producers on the first call stay replicated for the same cause.
    Feed first;
    ChainWalk w(made_by_, producer_kind, allowed_op, first);
    if (consumer.calls > 1 && start && w.walk(start, consumer.input.output_nr())) {
      f.held_back = first.producers;
      f.held_back_why = consumer.name() + " runs " + std::to_string(consumer.calls) +
                        " times in the probe (a shared consumer)";
    }
    return f;
  }
  if (!start) {
    f.why_not = "its input is not computed from another layer";
    f.starts_chain = true;
    return f;
  }
  ChainWalk w(made_by_, producer_kind, allowed_op, f, constants);
  if (!w.walk(start, consumer.input.output_nr())) {
    f.producers.clear();
    return f;
  }
  f.ops.assign(w.ops.rbegin(), w.ops.rend());
  check_readers(consumer, w.chain, f);
  return f;
}

void ProbeGraph::check_readers(const Layer& consumer, const std::unordered_set<Node*>& chain, Feed& f) {
  const auto own = own_nodes(consumer.output, [&](Node* n) { return chain.count(n) > 0; }, 32);
  for (Node* n : chain) {
    auto it = consumers_.find(n);
    if (it == consumers_.end()) continue;
    for (Node* reader : it->second) {
      if (chain.count(reader) || own.count(reader)) continue;
      auto made = made_by_.find(n);
      const std::string what =
          made != made_by_.end() ? made->second->name() + "'s output" : "the activation after " + op_short(n->name());
      f.why_not = what + " is also read by " + reader_name(reader) + ", which needs it whole";
      // Only the producers of the activation read: a partner producer of
      // the consumer is not at fault.
      const auto behind = nodes_back_from(n, [&](Node* m) { return !chain.count(m); });
      for (Layer* p : f.producers)
        if (behind.count(p->output.grad_fn().get())) f.held_back.push_back(p);
      f.held_back_why = f.why_not;
      f.producers.clear();
      return;
    }
  }
}

// A node of another layer's own computation reads the activation as that
// layer's input: a second consumer. Otherwise an operation; one that adds
// the activation to something else is a residual.
std::string ProbeGraph::reader_name(Node* reader) const {
  for (const Layer& l : layers_) {
    if (l.calls == 0) continue;
    Node* input = l.input.defined() ? l.input.grad_fn().get() : nullptr;
    if (own_nodes(l.output, [input](Node* n) { return n == input; }, 8).count(reader))
      return l.name() + " (a second consumer)";
  }
  const std::string op = op_short(reader->name());
  return op == "add" || op == "sub" ? op + " (a residual)" : op;
}

}  // namespace auto_detail
}  // namespace shardplan
