// Verify mode: what no static check can show of a TorchScript module (a
// traced graph's baked shapes, a `-1` reshape that absorbs a forgotten
// divide) shows when the sharded module runs next to the unsharded one.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>

#include "base/shape_text.h"
#include "script_internal.h"
#include "shardplan/error.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"

namespace shardplan {

namespace {

using torch::jit::Module;

struct Flat {
  std::string name;
  c10::IValue value;
};

// Every tensor of a forward's result, named by where it sits; anything else
// is kept so a rank that returns another structure is a problem, not a skip.
void flatten(const c10::IValue& v, const std::string& name, std::vector<Flat>& out) {
  if (v.isTuple() || v.isList()) {
    const auto items = v.isTuple() ? v.toTupleRef().elements().vec() : v.toListRef().vec();
    for (size_t i = 0; i < items.size(); ++i) flatten(items[i], name + "[" + std::to_string(i) + "]", out);
  } else if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict())
      flatten(kv.value(), name + "[" + (kv.key().isString() ? "'" + kv.key().toStringRef() + "'" : kv.key().tagKind()) +
                              "]",
              out);
  } else {
    out.push_back({name, v});
  }
}

// A scalar each float output element weighs into differently, so a gradient
// right only in sum is not passed.
at::Tensor scalar_of(const std::vector<Flat>& outputs) {
  at::Tensor loss;
  for (const Flat& f : outputs) {
    if (!f.value.isTensor() || !f.value.toTensor().requires_grad()) continue;
    const at::Tensor y = f.value.toTensor().to(at::kDouble);
    const at::Tensor w = at::sin(at::arange(y.numel(), y.options()).reshape(y.sizes()) * 0.37) + 0.5;
    loss = loss.defined() ? loss + (y * w).sum() : (y * w).sum();
  }
  return loss;
}

// What one forward gave: the outputs, detached, and the scalar of them to
// backward (undefined without autograd, or with no output that needs it);
// after backward, each parameter's gradient by path (undefined: none).
struct Ran {
  std::vector<Flat> outputs;
  at::Tensor loss;
  bool backward = false;
  std::map<std::string, at::Tensor> grads;
};

Ran run(Module& m, const std::vector<c10::IValue>& inputs, bool grad) {
  Ran r;
  at::AutoGradMode mode(grad);
  flatten(m.forward(inputs), "output", r.outputs);
  if (grad) r.loss = scalar_of(r.outputs);
  for (Flat& f : r.outputs)
    if (f.value.isTensor()) f.value = f.value.toTensor().detach();
  return r;
}

void backward(Module& m, Ran& r) {
  if (r.loss.defined()) r.loss.backward();
  r.loss = at::Tensor();
  r.backward = true;
  for (const auto& p : m.named_parameters()) r.grads[p.name] = p.value.grad();
}

std::vector<c10::IValue> inputs_as(const std::vector<at::Tensor>& probe, bool float64) {
  std::vector<c10::IValue> out;
  for (const auto& t : probe) out.emplace_back(float64 && t.is_floating_point() ? t.to(at::kDouble) : t);
  return out;
}

// A clone made without autograd has parameters that require no gradient:
// the original's say which do.
Module clone_of(const Module& m) {
  std::lock_guard<std::mutex> lock(script_detail::jit_mutex());
  Module c;
  {
    at::NoGradGuard no_grad;
    c = m.clone();
  }
  std::map<std::string, bool> wants;
  for (const auto& p : m.named_parameters()) wants[p.name] = p.value.requires_grad();
  for (const auto& p : c.named_parameters())
    if (wants[p.name] && !p.value.requires_grad()) p.value.set_requires_grad(true);
  return c;
}

std::string own_dtype(const Module& m) {
  for (const auto& p : m.named_parameters())
    if (p.value.is_floating_point()) return std::string(c10::toString(p.value.scalar_type()));
  return "its own dtype";
}

// The module to shard and the unsharded run: float64 when the module runs
// in it (a traced constant of another dtype may refuse), else as is. A
// module whose own backward fails is compared on its outputs alone.
std::pair<Module, Ran> reference(const Module& module, const std::vector<at::Tensor>& probe, std::string& dtype) {
  Module base = clone_of(module);
  bool f64 = true;
  try {
    base.to(at::kDouble);
    Module ref = clone_of(base);
    run(ref, inputs_as(probe, true), false);
  } catch (const std::exception&) {
    f64 = false;
    base = clone_of(module);
  }
  dtype = f64 ? "float64" : own_dtype(module);
  Module ref = clone_of(base);
  Ran want;
  try {
    want = run(ref, inputs_as(probe, f64), true);
  } catch (const std::exception& e) {
    throw Error(std::string("verify: the unsharded module fails on the probe, so it cannot be compared: ") +
                e.what());
  }
  try {
    backward(ref, want);
  } catch (const std::exception&) {
    want.backward = false;
    want.grads.clear();
  }
  return {base, want};
}

// This rank's gradient of each parameter against its piece of the unsharded
// one (zeros where that has none), folded into `v`.
void compare_gradients(ScriptVerification& v, const Ran& want, const Ran& got, const ParallelReport& report,
                       int rank) {
  at::NoGradGuard no_grad;
  const std::string on = " on rank " + std::to_string(rank);
  for (const ReportRow& row : report.rows) {
    auto it = std::find_if(v.gradients.begin(), v.gradients.end(),
                           [&](const ScriptOutputDiff& o) { return o.name == "gradient of '" + row.path + "'"; });
    const auto w = want.grads.find(row.path);
    const auto g = got.grads.find(row.path);
    if (it == v.gradients.end() || w == want.grads.end() || g == got.grads.end() || !it->problem.empty()) continue;
    if (!w->second.defined() && !g->second.defined()) continue;
    if (!g->second.defined()) {
      it->problem = "none" + on + ", where the unsharded module has one (the forward reads a tensor other than "
                    "the parameter an optimizer steps)";
      continue;
    }
    at::Tensor piece = w->second.defined() ? w->second : at::zeros(row.global_shape, g->second.options());
    for (const ShardSplit& s : row.splits) piece = take_split(piece, s);
    if (piece.sizes() != g->second.sizes()) {
      it->problem = "shape " + shape_str(g->second.sizes()) + on + ", expected " + shape_str(piece.sizes());
      continue;
    }
    const at::Tensor d = (g->second.to(at::kDouble) - piece.to(at::kDouble)).abs();
    const double worst = d.numel() ? (d.isnan().any().item<bool>() ? INFINITY : d.max().item<double>()) : 0.0;
    it->max_diff = std::max(it->max_diff, worst);
  }
}

// This rank's outputs folded into `v`.
void compare(ScriptVerification& v, const std::vector<Flat>& want, const std::vector<Flat>& got, int rank) {
  const std::string on = " on rank " + std::to_string(rank);
  for (size_t i = 0; i < want.size(); ++i) {
    ScriptOutputDiff& o = v.outputs[i];
    if (!o.problem.empty()) continue;
    if (i >= got.size() || got[i].name != want[i].name) {
      o.problem = "missing" + on;
    } else if (got[i].value.toTensor().sizes() != want[i].value.toTensor().sizes()) {
      o.problem = "shape " + shape_str(got[i].value.toTensor().sizes()) + on;
    } else {
      const at::Tensor d = (got[i].value.toTensor().to(at::kDouble) - want[i].value.toTensor().to(at::kDouble)).abs();
      // NaN compares false everywhere: count it as infinitely far.
      const double worst = d.numel() ? (d.isnan().any().item<bool>() ? INFINITY : d.max().item<double>()) : 0.0;
      o.max_diff = std::max(o.max_diff, worst);
    }
  }
}

}  // namespace

bool ScriptVerification::passed() const {
  if (!error.empty() || outputs.empty()) return false;
  for (const auto* list : {&outputs, &gradients})
    for (const auto& o : *list)
      if (!o.problem.empty() || !(o.max_diff <= tolerance * std::max(1.0, o.max_abs))) return false;
  return true;
}

namespace {

std::string diff_line(const ScriptOutputDiff& o) {
  if (!o.problem.empty()) return o.name + " " + shape_str(o.shape) + ": " + o.problem + "\n";
  char buf[160];
  std::snprintf(buf, sizeof buf, ": largest difference %.3g (largest magnitude %.3g)\n", o.max_diff, o.max_abs);
  return o.name + " " + shape_str(o.shape) + buf;
}

}  // namespace

// When the sharded module failed nothing was compared: the error alone.
// Gradients are many: the first five that fail, then one line for all.
std::string ScriptVerification::str() const {
  if (!error.empty()) return "the sharded module failed at " + std::to_string(world_size) + " ranks: " + error;
  std::string s;
  for (const auto& o : outputs) s += diff_line(o);
  double worst = 0, magnitude = 0;
  size_t failing = 0;
  for (const auto& o : gradients) {
    if (!o.problem.empty() || !(o.max_diff <= tolerance * std::max(1.0, o.max_abs)))
      if (++failing <= 5) s += diff_line(o);
    worst = std::max(worst, o.max_diff);
    magnitude = std::max(magnitude, o.max_abs);
  }
  char buf[200];
  if (!gradients.empty()) {
    std::snprintf(buf, sizeof buf, "gradients of %zu parameters%s: largest difference %.3g (largest magnitude %.3g)\n",
                  gradients.size(), failing > 5 ? (", " + std::to_string(failing) + " failing").c_str() : "", worst,
                  magnitude);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, "%s at %d ranks in %s (tolerance %.3g relative to max(1, largest magnitude))",
                passed() ? "passed" : "FAILED", world_size, dtype.c_str(), tolerance);
  return s + buf;
}

namespace {

ScriptOutputDiff diff_of(const std::string& name, const at::Tensor& t) {
  ScriptOutputDiff o;
  o.name = name;
  o.shape = t.sizes().vec();
  o.max_abs = t.numel() ? t.abs().max().to(at::kDouble).item<double>() : 0.0;
  return o;
}

}  // namespace

ScriptVerification verify_script(const Module& module, const Plan& plan, int world_size,
                                 const std::vector<at::Tensor>& probe, const ScriptOptions& options,
                                 double tolerance) {
  if (world_size < 1) throw Error("verify: world size " + std::to_string(world_size) + " must be at least 1");
  ScriptVerification v;
  v.plan_yaml = plan.to_yaml();
  v.world_size = world_size;
  auto [base, want] = reference(module, probe, v.dtype);
  v.tolerance = tolerance > 0 ? tolerance : v.dtype == "float64" ? 1e-9 : 1e-4;
  auto& outs = want.outputs;
  outs.erase(std::remove_if(outs.begin(), outs.end(), [](const Flat& f) { return !f.value.isTensor(); }), outs.end());
  for (const Flat& f : outs) v.outputs.push_back(diff_of(f.name, f.value.toTensor()));
  for (const auto& p : base.named_parameters()) {
    const auto g = want.grads.find(p.name);
    if (g != want.grads.end())
      v.gradients.push_back(diff_of("gradient of '" + p.name + "'", g->second.defined() ? g->second : p.value));
    if (g != want.grads.end() && !g->second.defined()) v.gradients.back().max_abs = 0;
  }
  const auto inputs = inputs_as(probe, v.dtype == "float64");
  std::mutex mu;
  v.reports.resize(world_size);
  try {
    run_ranks_in_threads(world_size, [&](World& world) {
      ScriptParallel sp = script_detail::parallelize_unverified(base, plan, world, options);
      Ran got;
      try {
        got = run(*sp.module, inputs, want.backward);
      } catch (const std::exception& e) {
        throw Error(std::string("forward: ") + e.what());
      }
      try {
        if (want.backward) backward(*sp.module, got);
      } catch (const std::exception& e) {
        throw Error(std::string("backward: ") + e.what());
      }
      auto& gout = got.outputs;
      gout.erase(std::remove_if(gout.begin(), gout.end(), [](const Flat& f) { return !f.value.isTensor(); }),
                 gout.end());
      std::lock_guard<std::mutex> lock(mu);
      compare(v, outs, gout, world.rank());
      compare_gradients(v, want, got, sp.report, world.rank());
      v.reports[world.rank()] = sp.report;
    });
  } catch (const std::exception& e) {
    v.error = e.what();
    v.reports.clear();
  }
  return v;
}

}  // namespace shardplan
