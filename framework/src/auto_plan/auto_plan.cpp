// auto_plan: from what the probe saw (auto_plan_probe.cpp) to rules.
//
// Decisions come in units that are sharded together or not at all (a pair's
// column half is wrong without its row half): attention, LSTM, Linear or
// Conv pairs, an LM head with its loss, a vocabulary embedding. The units
// are then written as an ordinary plan and run through check_plan(), the
// same checks parallelize() makes, plugins included; a unit a plugin
// rejects (a size the world does not divide, an option it does not
// support) is dropped with the plugin's message as the reason, and the
// rest is checked again. So the plan returned always applies.
#include "shardplan/auto_plan.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/rnn.h>
#include <torch/nn/modules/activation.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "auto_plan_probe.h"
#include "auto_plan_write.h"
#include "plan/plan_internal.h"
#include "shardplan/error.h"
#include "shardplan/nn/lstm.h"
#include "shardplan/nn/multihead_attention.h"
#include "shardplan/parallelize.h"
#include "shardplan/tensor_parallel.h"
#include "shardplan/world.h"

namespace shardplan {
namespace {

using auto_detail::Kind;
using auto_detail::Layer;
using plan_detail::join;

struct Unit {
  std::vector<Layer*> layers;
  std::vector<AutoPlanRule> rules;
  bool dropped = false;
};

std::string join_path(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

class Planner {
 public:
  Planner(torch::nn::Module& model, const auto_detail::MeshChoice& mesh, const AutoPlanOptions& o)
      : model_(model), world_(mesh.world_size), axis_(mesh.axis), mesh_(mesh), graph_(model) {
    if (o.probe) graph_.run(o.probe);
  }

  Plan plan() {
    decide();
    Plan p;
    for (int attempt = 0;; ++attempt) {
      p = write();
      std::vector<std::string> errors;
      check_plan(model_, p, world_, 0, errors);
      if (world_ > 1) check_plan(model_, p, world_, world_ - 1, errors);
      if (errors.empty()) break;
      if (attempt > static_cast<int>(units_.size())) throw Error("auto_plan: the plan keeps failing its checks: " + errors[0]);
      drop_rejected(errors);
    }
    p.comment = header();
    return p;
  }

 private:
  Layout layout(size_t rank, size_t dim) const {
    Layout l(rank);
    l[dim] = axis_;
    return l;
  }

  // Every parameter of `l` named `name` at each of its paths.
  void add(Unit& u, const Layer& l, const std::string& name, const Layout& lay,
           std::vector<std::pair<std::string, std::string>> options, const std::string& why) {
    for (const auto& path : l.paths) u.rules.push_back({join_path(path, name), lay, options, why});
  }

  const std::vector<int64_t>* shape(const Layer& l, const std::string& name) const {
    for (const auto& p : l.params)
      if (p.first == name) return &p.second;
    return nullptr;
  }

  bool claimed(const Layer* l) const { return claimed_.count(l) > 0; }
  void claim(Unit u) {
    // parallelize shards a module once per path it is registered under, so
    // a module shared that way cannot be cut (check_plan would say so less
    // plainly).
    for (Layer* l : u.layers)
      if (l->paths.size() > 1) {
        for (Layer* m : u.layers)
          reasons_[m] = ((m == l ? std::string("it is") : l->name() + " is") + " registered under " +
                            std::to_string(l->paths.size()) + " paths (" + join(l->paths, ", ") +
                            "): a module shared that way is not sharded automatically");
        return;
      }
    for (Layer* l : u.layers) claimed_.insert(l);
    units_.push_back(std::move(u));
  }
  void replicated(const Layer* l, const std::string& why) {
    if (!reasons_.count(l)) reasons_[l] = why;
  }
  // Producers whose pair with `b` failed for a cause of theirs (feed.held_back)
  // stay replicated for that cause: it replaces a first layer's "its input is
  // not computed from another layer", true of every first half, and follows
  // any other reason. The first such cause per layer is enough.
  void hold_back(const auto_detail::Feed& feed, const Layer& b) {
    for (Layer* a : feed.held_back) {
      if (claimed(a) || !held_back_.insert(a).second) continue;
      const std::string why = "its pair with " + b.name() + " is refused: " + feed.held_back_why;
      auto r = reasons_.find(a);
      if (r == reasons_.end() || chain_starts_.count(a))
        reasons_[a] = why;
      else
        r->second += "; " + why;
    }
  }

  void decide() {
    std::vector<Layer*> order = graph_.call_order();
    for (Layer* l : order) {
      if (l->kind == Kind::Attention) attention(*l);
      if (l->kind == Kind::LSTM) lstm(*l);
    }
    // Before pairs: an attention's output projection would otherwise be
    // refused as a pair's second half, with a less useful reason.
    for (Layer* l : order)
      if (l->kind == Kind::Linear && !l->inside_attention && !claimed(l)) heads(*l);
    for (Layer* l : order)
      if ((l->kind == Kind::Linear && !l->inside_attention) || l->kind == Kind::Conv) pair(*l);
    for (Layer* l : order)
      if (l->kind == Kind::CrossEntropy) head(*l);
    for (Layer* l : order)
      if (l->kind == Kind::Embedding) embedding(*l);
    for (Layer* l : order) {
      if (claimed(l) || l->inside_attention) continue;
      if (l->kind == Kind::Linear || l->kind == Kind::Conv)
        replicated(l, "not the first or second half of a pair");
      if (l->kind == Kind::CrossEntropy) replicated(l, "its input is not an LM head's output");
    }
  }

  void attention(Layer& l) {
    auto* a = dynamic_cast<nn::MultiheadAttentionImpl*>(l.module);
    if (!a->_qkv_same_embed_dim) {
      replicated(&l, "separate q/k/v projections (kdim or vdim differ from embed_dim) are not planned automatically");
      return;
    }
    Unit u;
    u.layers = {&l};
    add(u, l, "in_proj_weight", layout(2, 0), {},
        "head-parallel attention " + l.name() + ": q, k and v split by heads (the mha plugin keeps heads whole)");
    if (a->in_proj_bias.defined()) add(u, l, "in_proj_bias", layout(1, 0), {}, "follows the heads");
    add(u, l, "out_proj.weight", layout(2, 1), {{"input", "sharded"}},
        "row-parallel output projection of " + l.name() +
            ": reads this rank's heads' context as it is; one all-reduce after it");
    claim(std::move(u));
  }

  // Attention from separate q, k, v Linears into `o` (Llama's): each
  // projection column-parallel by whole heads of the head size the probe
  // showed, k and v replicated per rank when they have fewer heads than
  // ranks (grouped queries), o row-parallel on this rank's heads' context.
  void heads(Layer& o) {
    const auto s = auto_detail::split_heads(graph_, o, mesh_.axis_size);
    if (!s.attention) return;
    if (!s.why_not.empty()) {
      for (Layer* p : s.projections)
        replicated(p, "its attention into " + o.name() + " is not split by heads: " + s.why_not);
      replicated(&o, "its attention is not split by heads: " + s.why_not);
      return;
    }
    Unit u;
    for (size_t i = 0; i < s.projections.size(); ++i) head_projection(u, *s.projections[i], s.replicate[i], s, o);
    u.layers.push_back(&o);
    add(u, o, "weight", layout(2, 1), {{"input", "sharded"}, {"head_dim", std::to_string(s.head_dim)}},
        "row-parallel " + o.name() + ": reads the context of this rank's query heads (" +
            heads_of(s.heads / mesh_.axis_size, s.head_dim) + ") as it is; one all-reduce after it");
    claim(std::move(u));
  }

  static std::string heads_of(int64_t n, int64_t d) {
    return std::to_string(n) + (n == 1 ? " head of " : " heads of ") + std::to_string(d);
  }

  void head_projection(Unit& u, Layer& p, bool replicate, const auto_detail::HeadSplit& s, const Layer& o) {
    const std::string heads = heads_of(p.width / s.blocks / s.head_dim, s.head_dim);
    std::vector<std::pair<std::string, std::string>> options = {{"output", "sharded"},
                                                                {"head_dim", std::to_string(s.head_dim)}};
    std::string why = "column-parallel " + p.name() + " by whole heads (" + heads +
                      (s.blocks > 1 ? " in each of q, k and v, stacked" : "") +
                      "), output left split: only the attention into " + o.name() + " reads it, head by head";
    if (s.blocks > 1) options.emplace_back("blocks", std::to_string(s.blocks));
    if (replicate) {
      options.emplace_back("replicate_heads", "true");
      why = "column-parallel " + p.name() + " with its " + heads + " replicated over " +
            std::to_string(mesh_.axis_size) +
            " ranks: each keeps the weight whole and computes the head its query heads read (gradients all-reduced)";
    }
    u.layers.push_back(&p);
    add(u, p, "weight", layout(2, 0), options, why);
    // Replicated heads narrow the whole bias with the weight: no rule.
    if (shape(p, "bias") && !replicate) add(u, p, "bias", layout(1, 0), {}, "follows " + p.name() + "'s heads");
  }

  void lstm(Layer& l) {
    auto* m = dynamic_cast<nn::LSTMImpl*>(l.module);
    if (m->options.proj_size() > 0) {
      replicated(&l, "proj_size > 0 is not planned automatically");
      return;
    }
    Unit u;
    u.layers = {&l};
    bool first = true;
    for (const auto& p : l.params) {
      const bool weight = p.first.rfind("weight_", 0) == 0;
      add(u, l, p.first, layout(weight ? 2 : 1, 0), {},
          first ? "hidden-parallel LSTM " + l.name() +
                      ": the lstm plugin splits each gate's rows, so every rank owns whole hidden units"
                : "");
      first = false;
    }
    claim(std::move(u));
  }

  void pair(Layer& b) {
    if (claimed(&b)) return;
    const bool conv = b.kind == Kind::Conv;
    auto allowed = [conv](const std::string& op) {
      return auto_detail::is_elementwise_unary(op) || auto_detail::is_elementwise_binary(op) ||
             (conv && auto_detail::is_channel_preserving(op));
    };
    if (conv && b.groups != 1) {
      replicated(&b, "grouped convolution");
      return;
    }
    auto feed = graph_.feed(b, b.kind, allowed);
    if (feed.starts_chain) chain_starts_.insert(&b);
    if (feed.producers.empty()) {
      replicated(&b, feed.why_not);
      hold_back(feed, b);
      return;
    }
    for (Layer* a : feed.producers) {
      if (claimed(a)) {
        replicated(&b, "its producer " + a->name() + " is already sharded in another pair");
        return;
      }
      if (conv && a->groups != 1) {
        replicated(&b, "its producer " + a->name() + " is a grouped convolution");
        return;
      }
      if (a->width != feed.producers[0]->width) {
        replicated(&b, "its producers " + feed.producers[0]->name() + " and " + a->name() + " differ in width");
        return;
      }
    }
    std::vector<std::string> names;
    for (Layer* a : feed.producers) names.push_back(a->name());
    const std::string via = feed.ops.empty() ? "directly" : "through " + join(feed.ops, ", ");
    const std::string what = conv ? "output-channel" : "column";
    Unit u;
    for (Layer* a : feed.producers) {
      u.layers.push_back(a);
      const auto* w = shape(*a, "weight");
      add(u, *a, "weight", layout(w ? w->size() : 2, 0), {{"output", "sharded"}},
          what + "-parallel " + a->name() + ", output left split: only " + b.name() + " reads it (" + via + ")");
      if (shape(*a, "bias")) add(u, *a, "bias", layout(1, 0), {}, "follows " + a->name() + "'s outputs");
    }
    u.layers.push_back(&b);
    const auto* w = shape(b, "weight");
    add(u, b, "weight", layout(w ? w->size() : 2, 1), {{"input", "sharded"}},
        std::string(conv ? "input-channel" : "row") + "-parallel " + b.name() + ": reads the split output of " +
            join(names, " and ") + "; its partial sums are all-reduced once (the bias, replicated, after)");
    claim(std::move(u));
  }

  void head(Layer& loss) {
    auto feed = graph_.feed(loss, Kind::Linear, auto_detail::is_view);
    if (feed.producers.size() != 1) {
      replicated(&loss, feed.why_not.empty() ? "its input is not one Linear's output" : feed.why_not);
      return;
    }
    Layer* h = feed.producers[0];
    if (claimed(h)) {
      replicated(&loss, "its input comes from " + h->name() + ", already sharded in a pair");
      return;
    }
    if (loss.input.dim() != 2 || loss.input.size(1) != h->width) {
      replicated(&loss, "its input is not [N, classes] with the classes " + h->name() + "'s outputs");
      return;
    }
    Unit u;
    u.layers = {h, &loss};
    add(u, *h, "weight", layout(2, 0), {{"output", "sharded"}},
        "LM head '" + h->name() + "', vocab-parallel: its logits stay split straight into the loss '" + loss.name() + "'");
    if (shape(*h, "bias")) add(u, *h, "bias", layout(1, 0), {}, "follows the vocabulary");
    for (const auto& path : loss.paths)
      u.rules.push_back({path, layout(2, 1), {},
                         "vocab-parallel cross-entropy on " + h->name() +
                             "'s split logits: three [N] reductions instead of gathering [N, vocab]"});
    claim(std::move(u));
    vocab_[h->width] = h->name();
  }

  void embedding(Layer& e) {
    auto v = vocab_.find(e.width);
    if (v == vocab_.end()) {
      replicated(&e, "not the vocabulary of an LM head: a vocab-parallel lookup would add an all-reduce of its output");
      return;
    }
    Unit u;
    u.layers = {&e};
    add(u, e, "weight", layout(2, 0), {},
        "vocab-parallel embedding " + e.name() + " (the vocabulary of " + v->second +
            "): each rank looks up the ids it owns, one all-reduce of the rows");
    claim(std::move(u));
  }

  // An error from check_plan names a parameter or module path; the units
  // holding it go (with the message as the reason).
  void drop_rejected(const std::vector<std::string>& errors) {
    bool any = false;
    for (const auto& err : errors) {
      for (Unit& u : units_) {
        if (u.dropped) continue;
        bool hit = false;
        for (const auto& r : u.rules)
          if (auto_detail::mentions(err, r.path)) hit = true;
        if (!hit) continue;
        u.dropped = any = true;
        std::string why = err;
        const size_t colon = why.find(": ");
        if (why.rfind("<auto_plan>", 0) == 0 && colon != std::string::npos) why = why.substr(colon + 2);
        for (Layer* l : u.layers) reasons_[l] = "rejected " + mesh_.at_ranks() + ": " + why;
      }
    }
    if (!any)
      for (Unit& u : units_) {
        if (u.dropped) continue;
        u.dropped = true;
        for (Layer* l : u.layers) reasons_[l] = "rejected: " + errors[0];
      }
  }

  Plan write() {
    std::vector<std::string> universe;
    for (const auto& p : model_.named_parameters()) universe.push_back(p.key());
    std::vector<const AutoPlanRule*> specs;
    for (const Unit& u : units_)
      if (!u.dropped)
        for (const auto& r : u.rules) specs.push_back(&r);
    return auto_detail::write_plan(specs, std::move(universe), mesh_);
  }

  std::string header() const {
    std::ostringstream c;
    c << "Generated by shardplan::auto_plan for " << mesh_.describe() << (graph_.probed() ? ", from a probe forward." : ", without a probe forward (no pairs).");
    size_t kept = 0;
    for (const Unit& u : units_) kept += !u.dropped;
    if (kept == 0) c << "\nNothing to shard: every parameter stays replicated (the plan runs, each rank doing all the work).";
    std::vector<std::string> lines;
    for (const Layer& l : graph_.layers()) {
      if (l.inside_attention) continue;
      bool sharded = false;
      for (const Unit& u : units_)
        if (!u.dropped && std::find(u.layers.begin(), u.layers.end(), &l) != u.layers.end()) sharded = true;
      if (sharded) continue;
      auto r = reasons_.find(&l);
      lines.push_back(l.name() + ": " + (r == reasons_.end() ? "not planned" : r->second));
    }
    for (const auto& item : model_.named_modules()) {
      const auto* m = item.value().get();
      std::string type;
      if (dynamic_cast<const torch::nn::LinearImpl*>(m)) type = "Linear";
      if (dynamic_cast<const torch::nn::Conv1dImpl*>(m)) type = "Conv1d";
      if (dynamic_cast<const torch::nn::Conv2dImpl*>(m)) type = "Conv2d";
      if (dynamic_cast<const torch::nn::Conv3dImpl*>(m)) type = "Conv3d";
      if (dynamic_cast<const torch::nn::EmbeddingImpl*>(m)) type = "Embedding";
      if (dynamic_cast<const torch::nn::LSTMImpl*>(m)) type = "LSTM";
      if (dynamic_cast<const torch::nn::MultiheadAttentionImpl*>(m)) type = "MultiheadAttention";
      if (!type.empty())
        lines.push_back((item.key().empty() ? "(root)" : item.key()) + ": a torch::nn::" + type +
                        ", which cannot be sharded: build the model with shardplan::nn::" + type);
    }
    if (!lines.empty()) {
      c << "\nLeft replicated:";
      for (const auto& l : lines) c << "\n  " << l;
    }
    c << "\nEvery other parameter (norms, biases of row-parallel layers) is replicated.";
    return c.str();
  }

  torch::nn::Module& model_;
  int world_;
  std::string axis_;
  auto_detail::MeshChoice mesh_;
  auto_detail::ProbeGraph graph_;
  std::vector<Unit> units_;
  std::set<const Layer*> claimed_;
  std::map<const Layer*, std::string> reasons_;
  std::set<const Layer*> chain_starts_;  // first layers: their input is the model's
  std::set<const Layer*> held_back_;     // a pair's failure already explains them
  std::map<int64_t, std::string> vocab_;  // LM heads' vocabulary sizes
};

}  // namespace

Plan auto_plan(torch::nn::Module& model, int world_size, const AutoPlanOptions& options) {
  Planner planner(model, auto_detail::choose_mesh(options, world_size), options);
  return planner.plan();
}

ParallelReport parallelize(torch::nn::Module& model, World& world, const AutoPlanOptions& options) {
  return parallelize(model, auto_plan(model, world.size(), options), world);
}

namespace detail {

Plan auto_plan_for(torch::nn::Module& model, size_t devices, const ReplicaForward& forward,
                   const std::vector<at::Tensor>& example) {
  AutoPlanOptions options;
  if (!example.empty()) options.probe = [&](torch::nn::Module& m) { return forward(m, example); };
  return auto_plan(model, static_cast<int>(devices), options);
}

}  // namespace detail
}  // namespace shardplan
