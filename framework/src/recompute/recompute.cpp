// Recomputed regions: a custom autograd Function whose forward keeps only
// its inputs and the random streams, and whose backward runs the region
// again (shardplan/recompute.h).
#include "shardplan/recompute.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Optional.h>
#include <c10/util/irange.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/custom_class.h>
#include <torch/nn/module.h>

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_set>

#include "shardplan/error.h"
#include "shardplan/random.h"

namespace shardplan {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

thread_local bool tl_rerunning = false;       // fn runs again inside backward
thread_local bool tl_region_backward = false;  // the inner autograd pass

struct Flag {
  bool& flag;
  bool before;
  explicit Flag(bool& f) : flag(f), before(f) { flag = true; }
  ~Flag() { flag = before; }
};

// Sum and sum of squares of `n` elements.
struct Sample {
  std::pair<double, double> sums;
  int64_t n;
};

// What backward needs besides the saved inputs.
struct RegionState : torch::CustomClassHolder {
  RecomputeFn fn;
  std::string what;
  std::vector<bool> defined;  // per input: passed to the Function (undefined ones are not)
  // The parameters the region reads: grad targets of the inner pass. Leaves,
  // so holding them here makes no reference cycle through the graph.
  std::vector<at::Tensor> params;
  std::shared_ptr<RngTracker> tracker;
  std::map<std::string, at::Tensor> streams;  // the tracker's, at the region's start
  at::Tensor torch_rng;                        // torch's CPU generator's, without a tracker
  std::string fork;                            // the RngFork the region ran in
  std::vector<std::pair<double, double>> sums;  // per output: sum, sum of squares
  bool selective = false;  // dropout's masks kept, not drawn again; the final product skipped in the rerun
  DropoutMasks masks;
  std::vector<Sample> final_sums;  // per recompute_final_bmm: its `a`'s sample
};

// The selective region whose fn runs on this thread (its forward or its
// rerun), for recompute_final_bmm; null around anything run directly.
struct FinalProducts {
  bool rerun;
  std::vector<Sample>* sums;
  size_t skipped = 0;
};
thread_local FinalProducts* tl_final = nullptr;

struct FinalScope {
  FinalProducts* before;
  explicit FinalScope(FinalProducts* p) : before(tl_final) { tl_final = p; }
  ~FinalScope() { tl_final = before; }
};

// The product the rerun does not compute, with bmm's backward (the formula
// of autograd's BmmBackward0).
struct SkippedBmm : torch::autograd::Function<SkippedBmm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx->save_for_backward({a, b});
    return at::empty({a.size(0), a.size(1), b.size(2)}, a.options());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& g = grads[0];
    at::Tensor ga, gb;
    if (g.defined() && ctx->needs_input_grad(0)) ga = g.bmm(saved[1].transpose(1, 2).conj());
    if (g.defined() && ctx->needs_input_grad(1)) gb = saved[0].transpose(1, 2).conj().bmm(g);
    return {ga, gb};
  }
};

at::Tensor cpu_state() {
  at::Generator g = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

void set_cpu_state(const at::Tensor& s) {
  at::Generator g = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(s);
}

// The random streams as the region's forward found them, for the duration
// of the rerun; then back to where backward had them, so that whatever
// draws after backward does not repeat the region's masks.
class ReplayStreams {
 public:
  explicit ReplayStreams(const RegionState& s) : s_(s), scope_(s.tracker) {
    if (s.tracker) {
      now_ = s.tracker->get_states();
      s.tracker->set_states(s.streams);
    } else {
      cpu_now_ = cpu_state();
      set_cpu_state(s.torch_rng);
    }
    if (!s.fork.empty()) fork_.emplace(s.fork);
  }
  ~ReplayStreams() {
    fork_.reset();
    if (s_.tracker)
      s_.tracker->set_states(now_);
    else
      set_cpu_state(cpu_now_);
  }

 private:
  const RegionState& s_;
  RngTrackerScope scope_;
  std::map<std::string, at::Tensor> now_;
  at::Tensor cpu_now_;
  c10::optional<RngFork> fork_;
};

// Two passes over the output and no copy of it: the sum (accumulated in
// float64) and the 2-norm.
std::pair<double, double> checksum(const at::Tensor& t) {
  if (!t.defined() || !t.is_floating_point()) return {0, 0};
  const at::Tensor d = t.detach();
  const double norm = d.norm().item<double>();
  return {d.sum(at::kDouble).item<double>(), norm * norm};
}

// Every 61st element: a prime stride crosses every row and column of
// attention's probabilities, so another dropout mask or other scores show,
// for 1/61 of the passes over the largest tensor of the region.
Sample sample_checksum(const at::Tensor& t) {
  const at::Tensor sample = t.detach().reshape(-1).slice(0, 0, t.numel(), 61);
  return {checksum(sample), sample.numel()};
}

// Bit-equal on the CPU; the slack is for kernels that reduce in another
// order on a rerun. A different dropout mask moves the sum of squares by far
// more.
bool same(const std::pair<double, double>& a, const std::pair<double, double>& b, int64_t numel) {
  const double scale = std::sqrt(static_cast<double>(numel) * std::max(a.second, b.second));
  return std::abs(a.first - b.first) <= 1e-6 * scale + 1e-300 &&
         std::abs(a.second - b.second) <= 1e-6 * std::max(a.second, b.second) + 1e-300;
}

std::vector<at::Tensor> all_inputs(const RegionState& s, const variable_list& given) {
  std::vector<at::Tensor> in;
  size_t k = 0;
  for (bool d : s.defined) in.push_back(d ? given[k++] : at::Tensor());
  return in;
}

// The inner pass computes gradients for its targets only: a parameter the
// region reads but does not name would lose its gradient silently.
void check_reads_only(const RegionState& s, const variable_list& outs, const variable_list& targets) {
  std::unordered_set<const void*> named;
  for (const at::Tensor& t : targets) named.insert(t.unsafeGetTensorImpl());
  std::vector<torch::autograd::Node*> todo;
  for (const at::Tensor& o : outs) todo.push_back(o.grad_fn().get());
  std::unordered_set<torch::autograd::Node*> seen;
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (!n || !seen.insert(n).second) continue;
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(n)) {
      if (!named.count(acc->variable.unsafeGetTensorImpl()))
        throw Error("recompute: " + s.what + " reads a tensor that needs a gradient and is neither its input nor "
                    "one of its own parameters (shape " + c10::str(acc->variable.sizes()) +
                    "); recomputation would lose its gradient: pass it as an input of the region");
      continue;
    }
    for (const auto& e : n->next_edges()) todo.push_back(e.function.get());
  }
}

struct RecomputeFunction : torch::autograd::Function<RecomputeFunction> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<RegionState> state, at::TensorList inputs,
                               at::TensorList params) {
    RegionState& s = *state;
    if (s.tracker) {
      // Every axis' stream made now: one the region creates on first use
      // would otherwise be missing from the saved states.
      for (const auto& axis : s.tracker->mesh().axes()) s.tracker->sharded(axis.first);
      s.streams = s.tracker->get_states();
    } else {
      s.torch_rng = cpu_state();
    }
    s.fork = current_rng_fork();
    const variable_list given(inputs.begin(), inputs.end());
    std::vector<at::Tensor> out;
    {
      c10::optional<DropoutMaskScope> tape;
      if (s.selective) tape.emplace(s.masks, DropoutMaskScope::Mode::record);
      FinalProducts final{false, &s.final_sums};
      FinalScope scope(s.selective ? &final : nullptr);
      out = s.fn(all_inputs(s, given));
    }
    // The first output only: a region's others derive from what it does
    // (attention's weights from the same masks), and summing the
    // [heads, T, S] weights again would cost a pass over the largest
    // activation of the region, twice a step.
    // A selective rerun that skips its final product is checked on that
    // product's samples instead.
    if (!out.empty() && s.final_sums.empty()) s.sums.push_back(checksum(out[0]));
    // Outputs nobody differentiates (attention's weights, dropped when not
    // asked for) stay without a gradient instead of a tensor of zeros.
    ctx->set_materialize_grads(false);
    ctx->save_for_backward(given);
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state = c10::static_intrusive_pointer_cast<RegionState>(ctx->saved_data["state"].toCapsule());
    RegionState& s = *state;
    variable_list inputs;
    for (const at::Tensor& saved : ctx->get_saved_variables()) {
      at::Tensor d = saved.detach();
      if (saved.requires_grad()) d.requires_grad_(true);
      inputs.push_back(d);
    }
    std::vector<at::Tensor> out;
    std::vector<Sample> final_sums;
    FinalProducts final{true, &final_sums};
    {
      ReplayStreams replay(s);
      Flag rerun(tl_rerunning);
      at::AutoGradMode grad(true);
      c10::optional<DropoutMaskScope> tape;
      if (s.selective) tape.emplace(s.masks, DropoutMaskScope::Mode::replay);
      s.masks.next = 0;
      FinalScope scope(s.selective ? &final : nullptr);
      out = s.fn(all_inputs(s, inputs));
    }
    bool alike = s.masks.next == s.masks.masks.size() && final_sums.size() == s.final_sums.size();
    s.masks = DropoutMasks();  // the rerun's graph holds what it needs of them
    for (size_t i = 0; alike && i < final_sums.size(); ++i)
      alike = same(s.final_sums[i].sums, final_sums[i].sums, final_sums[i].n);
    // Outputs a skipped product left uninitialised say nothing.
    for (size_t i = 0; alike && final.skipped == 0 && i < out.size() && i < s.sums.size(); ++i)
      alike = same(s.sums[i], checksum(out[i]), out[i].defined() ? out[i].numel() : 0);
    if (!alike)
      throw Error("recompute: " + s.what +
                  " computed other outputs when recomputed in backward: its forward is not deterministic apart "
                  "from shardplan::dropout (it draws other random numbers, or reads state that changed), which "
                  "recomputation cannot replay; leave it out of the plan's recompute: list");
    variable_list outs, gouts, targets;
    for (size_t i = 0; i < out.size(); ++i)
      if (out[i].defined() && out[i].requires_grad() && grads[i].defined()) {
        outs.push_back(out[i]);
        gouts.push_back(grads[i]);
      }
    std::vector<size_t> where;  // index in the result of each target
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].requires_grad()) {
        targets.push_back(inputs[i]);
        where.push_back(1 + i);
      }
    for (size_t i = 0; i < s.params.size(); ++i)
      if (s.params[i].requires_grad()) {
        targets.push_back(s.params[i]);
        where.push_back(1 + inputs.size() + i);
      }
    variable_list result(1 + inputs.size() + s.params.size());
    check_reads_only(s, outs, targets);
    if (outs.empty() || targets.empty()) return result;
    Flag inner(tl_region_backward);
    const variable_list g = torch::autograd::grad(outs, targets, gouts, /*retain_graph=*/false,
                                                  /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < g.size(); ++k) result[where[k]] = g[k];
    return result;
  }
};

}  // namespace

const char* recompute_mode_name(RecomputeMode mode) {
  switch (mode) {
    case RecomputeMode::full: return "full";
    case RecomputeMode::selective: return "selective";
    default: return "none";
  }
}

bool in_recompute_backward() { return tl_region_backward; }

std::vector<at::Tensor> recompute(const RecomputeFn& fn, const std::vector<at::Tensor>& inputs,
                                  const std::vector<at::Tensor>& params, const std::string& what,
                                  bool selective) {
  FinalScope direct(nullptr);  // a region run directly skips no product
  if (!at::GradMode::is_enabled() || tl_rerunning) return fn(inputs);
  bool needs_grad = false;
  for (const auto* list : {&inputs, &params})
    for (const at::Tensor& t : *list) needs_grad = needs_grad || (t.defined() && t.requires_grad());
  if (!needs_grad) return fn(inputs);
  auto state = c10::make_intrusive<RegionState>();
  state->fn = fn;
  state->what = what;
  state->selective = selective;
  state->tracker = current_rng_tracker_ptr();
  std::vector<at::Tensor> given;
  for (const at::Tensor& t : inputs) {
    state->defined.push_back(t.defined());
    if (t.defined()) given.push_back(t);
  }
  std::vector<at::Tensor> ps;
  for (const at::Tensor& p : params)
    if (p.defined()) ps.push_back(p);
  state->params = ps;
  return RecomputeFunction::apply(state, at::TensorList(given), at::TensorList(ps));
}

void Recomputable::set_recompute_mode(RecomputeMode mode, const std::string& path) {
  recompute_mode_ = mode;
  recompute_path_ = path;
}

std::string Recomputable::what() const {
  const auto* m = dynamic_cast<const torch::nn::Module*>(this);
  return "module '" + recompute_path_ + "' (" + (m ? m->name() : std::string("?")) + ")";
}

at::Tensor Recomputable::recompute_full(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn,
                                        const std::vector<at::Tensor>& inputs) {
  if (recompute_mode_ != RecomputeMode::full || !at::GradMode::is_enabled() || tl_rerunning) {
    FinalScope direct(nullptr);
    return fn(inputs);
  }
  auto* m = dynamic_cast<torch::nn::Module*>(this);
  std::vector<at::Tensor> params;
  if (m) {
    // A tensor registered twice (tied) is one input of the region.
    std::unordered_set<const void*> seen;
    for (const at::Tensor& p : m->parameters())
      if (p.defined() && seen.insert(p.unsafeGetTensorImpl()).second) params.push_back(p);
  }
  return recompute([fn](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{fn(in)}; }, inputs,
                   params, what())[0];
}

std::vector<at::Tensor> Recomputable::recompute_selective(const RecomputeFn& fn, const std::vector<at::Tensor>& inputs) {
  if (recompute_mode_ != RecomputeMode::selective) {
    FinalScope direct(nullptr);
    return fn(inputs);
  }
  return recompute(fn, inputs, {}, what(), /*selective=*/true);
}

at::Tensor recompute_final_bmm(const at::Tensor& a, const at::Tensor& b) {
  FinalProducts* f = tl_final;
  if (!f) return at::bmm(a, b);
  f->sums->push_back(sample_checksum(a));
  if (!f->rerun) return at::bmm(a, b);
  ++f->skipped;
  return SkippedBmm::apply(a, b);
}

}  // namespace shardplan
