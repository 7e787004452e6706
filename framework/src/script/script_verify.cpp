// Verify mode: what no static check can show of a TorchScript module (a
// traced graph's baked shapes, a `-1` reshape that absorbs a forgotten
// divide) shows when the sharded module runs next to the unsharded one.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdio>
#include <mutex>

#include "base/shape_text.h"
#include "script_internal.h"
#include "shardplan/error.h"
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

std::vector<Flat> run(Module& m, const std::vector<c10::IValue>& inputs) {
  at::NoGradGuard no_grad;
  std::vector<Flat> out;
  flatten(m.forward(inputs), "output", out);
  return out;
}

std::vector<c10::IValue> inputs_as(const std::vector<at::Tensor>& probe, bool float64) {
  std::vector<c10::IValue> out;
  for (const auto& t : probe) out.emplace_back(float64 && t.is_floating_point() ? t.to(at::kDouble) : t);
  return out;
}

Module clone_of(const Module& m) {
  std::lock_guard<std::mutex> lock(script_detail::jit_mutex());
  at::NoGradGuard no_grad;
  return m.clone();
}

std::string own_dtype(const Module& m) {
  for (const auto& p : m.named_parameters())
    if (p.value.is_floating_point()) return std::string(c10::toString(p.value.scalar_type()));
  return "its own dtype";
}

// The module to shard and the unsharded outputs: float64 when the module
// runs in it (a traced constant of another dtype may refuse), else as is.
std::pair<Module, std::vector<Flat>> reference(const Module& module, const std::vector<at::Tensor>& probe,
                                               std::string& dtype) {
  Module base = clone_of(module);
  try {
    base.to(at::kDouble);
    Module ref = clone_of(base);
    auto want = run(ref, inputs_as(probe, true));
    dtype = "float64";
    return {base, want};
  } catch (const std::exception&) {
  }
  base = clone_of(module);
  Module ref = clone_of(base);
  try {
    auto want = run(ref, inputs_as(probe, false));
    dtype = own_dtype(module);
    return {base, want};
  } catch (const std::exception& e) {
    throw Error(std::string("verify: the unsharded module fails on the probe, so it cannot be compared: ") +
                e.what());
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
  for (const auto& o : outputs)
    if (!o.problem.empty() || !(o.max_diff <= tolerance * std::max(1.0, o.max_abs))) return false;
  return true;
}

std::string ScriptVerification::str() const {
  std::string s;
  char buf[160];
  for (const auto& o : outputs) {
    if (!o.problem.empty()) {
      s += o.name + " " + shape_str(o.shape) + ": " + o.problem + "\n";
      continue;
    }
    std::snprintf(buf, sizeof buf, ": largest difference %.3g (largest magnitude %.3g)\n", o.max_diff, o.max_abs);
    s += o.name + " " + shape_str(o.shape) + buf;
  }
  if (!error.empty()) s += "the sharded module failed: " + error + "\n";
  std::snprintf(buf, sizeof buf, "%s at %d ranks in %s (tolerance %.3g relative to max(1, largest magnitude))",
                passed() ? "passed" : "FAILED", world_size, dtype.c_str(), tolerance);
  return s + buf;
}

ScriptVerification verify_script(const Module& module, const Plan& plan, int world_size,
                                 const std::vector<at::Tensor>& probe, const ScriptOptions& options,
                                 double tolerance) {
  if (world_size < 1) throw Error("verify: world size " + std::to_string(world_size) + " must be at least 1");
  ScriptVerification v;
  v.plan_yaml = plan.to_yaml();
  v.world_size = world_size;
  auto [base, want] = reference(module, probe, v.dtype);
  v.tolerance = tolerance > 0 ? tolerance : v.dtype == "float64" ? 1e-9 : 1e-4;
  for (const Flat& f : want) {
    ScriptOutputDiff o;
    o.name = f.name;
    if (!f.value.isTensor()) continue;
    const at::Tensor t = f.value.toTensor();
    o.shape = t.sizes().vec();
    o.max_abs = t.numel() ? t.abs().max().to(at::kDouble).item<double>() : 0.0;
    v.outputs.push_back(o);
  }
  want.erase(std::remove_if(want.begin(), want.end(), [](const Flat& f) { return !f.value.isTensor(); }), want.end());
  const auto inputs = inputs_as(probe, v.dtype == "float64");
  std::mutex mu;
  v.reports.resize(world_size);
  try {
    run_ranks_in_threads(world_size, [&](World& world) {
      ScriptParallel sp = script_detail::parallelize_unverified(base, plan, world, options);
      std::vector<Flat> got;
      try {
        got = run(*sp.module, inputs);
      } catch (const std::exception& e) {
        throw Error(std::string("forward: ") + e.what());
      }
      got.erase(std::remove_if(got.begin(), got.end(), [](const Flat& f) { return !f.value.isTensor(); }), got.end());
      std::lock_guard<std::mutex> lock(mu);
      compare(v, want, got, world.rank());
      v.reports[world.rank()] = sp.report;
    });
  } catch (const std::exception& e) {
    v.error = e.what();
    v.reports.clear();
  }
  return v;
}

}  // namespace shardplan
