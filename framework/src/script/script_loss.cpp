// The loss in the graph. A column-parallel output left sharded holds this
// rank's slice of its last dim; where that is the logits of a classifier,
// torch's cross-entropy on the slice normalises over the slice only and runs
// without error, silently wrong. So each aten::cross_entropy_loss a sharded
// output reaches becomes shardplan::vocab_cross_entropy (Megatron's
// vocab-parallel loss), and one it reaches through an op whose effect on the
// classes the rewrite cannot see is refused.
#include <algorithm>
#include <set>
#include <utility>

#include "script_decide.h"
#include "script_internal.h"

namespace shardplan::script_detail {

using torch::jit::Node;
using torch::jit::Value;
namespace aten = torch::jit::aten;
namespace prim = torch::jit::prim;

namespace {

bool constant_int(Value* v, int64_t want) {
  auto iv = torch::jit::toIValue(v);
  return iv && iv->isInt() && iv->toInt() == want;
}

// `x.size()` / `x.shape` of a value of `chain`.
bool sizes_of(Value* list, const std::set<Value*>& chain) {
  Node* n = list->node();
  return n->kind() == aten::size && n->inputs().size() == 1 && chain.count(n->input(0));
}

// `e` is the (local) size of the last dim of a value of `chain`:
// x.size(-1), x.shape[-1], or C of `B, T, C = x.size()`.
bool last_size(Value* e, const std::set<Value*>& chain) {
  Node* n = e->node();
  if (n->kind() == aten::size && n->inputs().size() == 2)
    return chain.count(n->input(0)) && constant_int(n->input(1), -1);
  if (n->kind() == aten::__getitem__) return sizes_of(n->input(0), chain) && constant_int(n->input(1), -1);
  if (n->kind() == prim::ListUnpack) return e == n->outputs().back() && sizes_of(n->input(0), chain);
  return false;
}

// Whether `n`, reading a value of `chain` as its input 0, keeps that value's
// last dim whole and last: then a loss after it still sees this rank's
// classes as its class dim (of 2-D logits; the kernel refuses more dims).
bool keeps_classes(Node* n, const std::set<Value*>& chain) {
  const auto k = n->kind();
  if (k == aten::contiguous || k == aten::to) return true;
  if (k == aten::view || k == aten::reshape) {
    Node* list = n->input(1)->node();
    return list->kind() == prim::ListConstruct && list->inputs().size() > 0 && last_size(list->inputs().back(), chain);
  }
  if (k == aten::flatten) {  // flatten(start, end) with end at most -2
    auto end = torch::jit::toIValue(n->input(2));
    return end && end->isInt() && end->toInt() <= -2;
  }
  return false;
}

// The forward walk from one sharded output. A value is reached cleanly
// (through ops that keep the classes) or through `via`, the first op that
// does not; shardplan's reductions and gathers end the walk (their outputs
// are whole), as do reads of a size.
class Walk {
 public:
  explicit Walk(const ShardedOutput& from) : from_(from) {}

  std::vector<Node*> losses() {
    clean_.insert(from_.value);
    visit(from_.value, nullptr);
    while (!todo_.empty()) {
      auto [v, via] = todo_.back();
      todo_.pop_back();
      for (const auto& u : v->uses()) follow(u, via);
    }
    return losses_;
  }

 private:
  void visit(Value* v, Node* via) {
    if (via ? seen_.insert(v).second : true) todo_.push_back({v, via});
  }

  void follow(const torch::jit::Use& u, Node* via) {
    Node* n = u.user;
    const auto k = n->kind();
    if (k == aten::cross_entropy_loss && u.offset == 0) return loss(n, via);
    if (k == kReduceFrom || k == kGatherFrom || k == aten::size || k == aten::dim) return;
    if (!via && u.offset == 0 && keeps_classes(n, clean_)) {
      clean_.insert(n->output());
      return visit(n->output(), nullptr);
    }
    if (k == prim::Return) {  // a block's result: the node owning the block
      Node* owner = n->owningBlock()->owningNode();
      if (owner) for (Value* o : owner->outputs()) visit(o, via ? via : owner);
      return;
    }
    for (Value* o : n->outputs()) visit(o, via ? via : n);
    for (auto* b : n->blocks())
      for (Value* in : b->inputs()) visit(in, via ? via : n);
  }

  void loss(Node* n, Node* via) {
    if (!via) {
      if (std::find(losses_.begin(), losses_.end(), n) == losses_.end()) losses_.push_back(n);
      return;
    }
    fail(*from_.action->param,
         "its output, left split along the last dim (" + from_.action->cut.note + "), reaches aten::cross_entropy_loss at " + where(n) + " through " + via->kind().toQualString() + " at " +
             where(via) + ", which the rewrite cannot show keeps that dim as the classes: cross-entropy on a " +
             "slice of the classes would be silently wrong. Pass the logits to the loss directly or through " +
             "view/reshape(-1, x.size(-1)), flatten(0, -2), contiguous or to; or gather them (output: gathered)");
  }

  const ShardedOutput& from_;
  std::set<Value*> clean_, seen_;
  std::vector<std::pair<Value*, Node*>> todo_;
  std::vector<Node*> losses_;
};

// shardplan::vocab_cross_entropy in place of `n`, same arguments plus the group.
void replace_loss(Node* n, int64_t group) {
  auto& g = *n->owningGraph();
  torch::jit::WithInsertPoint at(n);
  std::vector<torch::jit::NamedValue> args(n->inputs().begin(), n->inputs().end());
  args.emplace_back(c10::IValue(group));
  Value* y = g.insert(kVocabCrossEntropy, args, {}, n->sourceRange());
  n->output()->replaceAllUsesWith(y);
  n->destroy();
}

}  // namespace

std::vector<std::pair<const Param*, std::string>> vocab_parallel_losses(const std::vector<ShardedOutput>& outputs) {
  std::vector<std::pair<const Param*, std::string>> notes;
  for (const ShardedOutput& o : outputs) {
    auto losses = Walk(o).losses();
    for (Node* n : losses) replace_loss(n, o.group);
    if (!losses.empty())
      notes.push_back({o.action->param, ", cross-entropy vocab-parallel (shardplan::vocab_cross_entropy)"});
  }
  return notes;
}

}  // namespace shardplan::script_detail
