#pragma once
// The check every parallel layer must pass: the same model trained sharded
// (ranks as threads) and unsharded (one process) must agree on the forward
// output, the input gradients, the parameter gradients and the parameters
// after several optimizer steps.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <vector>

#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"

namespace parity {

// max |a - b| / max(1, max |b|): relative to the reference's scale, so tiny
// entries do not make the tolerance meaningless.
inline double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes()) return 1e300;
  if (b.numel() == 0) return 0;
  double scale = std::max(1.0, b.abs().max().item<double>());
  return (a - b).abs().max().item<double>() / scale;
}

inline double tolerance(torch::Dtype dtype) { return dtype == torch::kDouble ? 1e-12 : 1e-5; }

// float32's tolerance cannot be one number: another CPU's BLAS kernels (or
// thread count) sum in another order, and a few optimizer steps amplify the
// rounding by an amount that depends on the layer, the optimizer and the
// machine (the conv3d rows drifted 1.5e-5 under OpenBLAS's SkylakeX kernels).
// So the unsharded float32 run is repeated in float64, and the sharded run may
// be off by 16 times the largest deviation float32 rounding alone gave the
// unsharded run anywhere in it, never less than tolerance(kFloat). A sharding
// bug (a wrong scale, a missing reduction) is off by orders of magnitude more.
inline double float32_tolerance(double unsharded_float32_vs_float64) {
  return std::max(tolerance(torch::kFloat), 16 * unsharded_float32_vs_float64);
}

struct Setup {
  int world = 2;
  torch::Dtype dtype = torch::kDouble;
  int steps = 5;
  bool adam = false;
  // float64's bound, when not tolerance(kDouble): a deep model (a Llama's
  // softmax, RMSNorms and SwiGLU over several steps) reassociates more.
  double float64_tolerance = 0;
  // One entry per step: the inputs of that step. Floating inputs get
  // requires_grad and their gradients are compared.
  std::vector<std::vector<torch::Tensor>> inputs;
  // Runs the model (dynamic_cast it: Module is a virtual base); returns a
  // tensor that is the same on every rank (the
  // output, gathered, or a loss). Non-scalar results are reduced to a loss by
  // a fixed random weighting, so every element's gradient matters.
  std::function<torch::Tensor(torch::nn::Module&, const std::vector<torch::Tensor>&)> forward;
  // This rank's expected piece of a full parameter (or of its gradient):
  // usually shardplan::shard_of along the planned dim; the full tensor for
  // replicated parameters.
  std::function<torch::Tensor(const std::string& name, const torch::Tensor& full, int rank, int world)> local;
};

// A Setup::local for parameters each cut along one dim: the first regex that
// fully matches the name gives (dim, blocks); any other parameter is whole.
using Shards = std::map<std::string, std::pair<int64_t, int64_t>>;
inline std::function<torch::Tensor(const std::string&, const torch::Tensor&, int, int)> local_by(const Shards& shards) {
  return [shards](const std::string& name, const torch::Tensor& full, int rank, int world) {
    for (const auto& kv : shards)
      if (std::regex_match(name, std::regex(kv.first)))
        return shardplan::shard_of(full, kv.second.first, world, rank, kv.second.second);
    return full;
  };
}

struct Trace {
  std::vector<torch::Tensor> outputs;
  std::vector<std::vector<torch::Tensor>> input_grads;
  std::map<std::string, torch::Tensor> grads;   // after the first backward
  std::map<std::string, torch::Tensor> params;  // after all steps
};

inline Trace train(torch::nn::Module& model, const Setup& s, const torch::Tensor& probe_seed) {
  Trace t;
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (s.adam) opt = std::make_unique<torch::optim::Adam>(model.parameters(), torch::optim::AdamOptions(1e-2));
  else opt = std::make_unique<torch::optim::SGD>(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < s.steps; ++step) {
    opt->zero_grad();
    std::vector<torch::Tensor> in;
    for (const auto& x : s.inputs[step]) {
      auto c = x.clone();
      if (c.is_floating_point()) c.requires_grad_(true);
      in.push_back(c);
    }
    auto y = s.forward(model, in);
    auto loss = y.dim() == 0 ? y : (y * probe_seed.expand_as(y).to(y.scalar_type()) *
                                    torch::linspace(0.5, 1.5, y.numel(), y.options()).view(y.sizes()))
                                       .sum();
    loss.backward();
    t.outputs.push_back(y.detach().clone());
    std::vector<torch::Tensor> grads;
    for (const auto& x : in) grads.push_back(x.is_floating_point() ? x.grad().clone() : torch::Tensor());
    t.input_grads.push_back(grads);
    if (step == 0)
      for (const auto& p : model.named_parameters())
        t.grads[p.key()] = p.value().grad().defined() ? p.value().grad().clone() : torch::zeros_like(p.value());
    opt->step();
  }
  for (const auto& p : model.named_parameters()) t.params[p.key()] = p.value().detach().clone();
  return t;
}

// The largest rel_err between two traces of the same run, over everything
// compare() checks.
inline double max_rel_err(const Trace& a, const Trace& b) {
  double e = 0;
  auto take = [&](const torch::Tensor& x, const torch::Tensor& y) {
    if (x.defined() && y.defined()) e = std::max(e, rel_err(x, y.to(x.scalar_type())));
  };
  for (size_t k = 0; k < a.outputs.size(); ++k) {
    take(a.outputs[k], b.outputs[k]);
    for (size_t i = 0; i < a.input_grads[k].size(); ++i) take(a.input_grads[k][i], b.input_grads[k][i]);
  }
  for (const auto& kv : a.grads) take(kv.second, b.grads.at(kv.first));
  for (const auto& kv : a.params) take(kv.second, b.params.at(kv.first));
  return e;
}

// Trains `reference` unsharded, then `world` clones of it (made before any
// training) sharded by `plan` on ranks as threads, and returns one message
// per mismatch ("rank 1: grad fc1.weight: relative error ..."). Clones are
// made up front because ranks that are threads would race on torch's global
// generator if each built its own model.
template <class ModuleImpl>
std::vector<std::string> compare(const std::shared_ptr<ModuleImpl>& reference, const shardplan::Plan& plan,
                                 const Setup& s, const std::string& backend = "local") {
  std::vector<std::shared_ptr<ModuleImpl>> replicas;
  for (int r = 0; r < s.world; ++r) replicas.push_back(std::dynamic_pointer_cast<ModuleImpl>(reference->clone()));
  auto reference64 = std::dynamic_pointer_cast<ModuleImpl>(reference->clone());
  const torch::Tensor probe = torch::tensor(1.0, torch::kDouble);
  const Trace expected = train(*reference, s, probe);

  std::mutex mu;
  std::vector<Trace> traces(s.world);
  shardplan::run_ranks_in_threads(
      s.world,
      [&](shardplan::World& world) {
        auto& model = *replicas[world.rank()];
        shardplan::parallelize(model, plan, world);
        Trace got = train(model, s, probe);
        std::lock_guard<std::mutex> lock(mu);
        traces[world.rank()] = std::move(got);
      },
      backend);

  // After the sharded runs: a clone shares tensors held in options (a loss's
  // class weights) with the others, and converting it converts them too.
  double tol = s.dtype == torch::kDouble && s.float64_tolerance > 0 ? s.float64_tolerance : tolerance(s.dtype);
  if (s.dtype == torch::kFloat) {
    reference64->to(torch::kDouble);
    Setup s64 = s;
    s64.dtype = torch::kDouble;
    for (auto& step : s64.inputs)
      for (auto& x : step)
        if (x.is_floating_point()) x = x.to(torch::kDouble);
    // A model with float32 state outside its parameters and buffers cannot
    // run in float64 (the same class weights): it keeps the fixed tolerance.
    try {
      tol = float32_tolerance(max_rel_err(expected, train(*reference64, s64, probe)));
    } catch (const c10::Error&) {
    }
    reference64->to(torch::kFloat);
  }

  std::vector<std::string> failures;
  for (int rank = 0; rank < s.world; ++rank) {
    const Trace& got = traces[rank];
    std::vector<std::string> bad;
    auto expect_close = [&](const std::string& what, const torch::Tensor& a, const torch::Tensor& b) {
      if (!a.defined() && !b.defined()) return;
      double e = (a.defined() && b.defined()) ? rel_err(a, b) : 1e300;
      if (!(e <= tol)) {
        char text[32];
        std::snprintf(text, sizeof text, "%.3g", e);
        bad.push_back(what + ": relative error " + text + " (bound " + std::to_string(tol) + ")");
      }
    };
    for (int step = 0; step < s.steps; ++step) {
      expect_close("output step " + std::to_string(step), got.outputs[step], expected.outputs[step]);
      for (size_t i = 0; i < got.input_grads[step].size(); ++i)
        expect_close("input " + std::to_string(i) + " grad step " + std::to_string(step), got.input_grads[step][i],
                     expected.input_grads[step][i]);
    }
    for (const auto& kv : expected.params) {
      const std::string& name = kv.first;
      if (!got.params.count(name)) {
        bad.push_back("parameter " + name + " is missing after parallelize");
        continue;
      }
      expect_close("grad " + name, got.grads.at(name), s.local(name, expected.grads.at(name), rank, s.world));
      expect_close("param " + name, got.params.at(name), s.local(name, kv.second, rank, s.world));
    }
    for (auto& b : bad) failures.push_back("rank " + std::to_string(rank) + ": " + b);
  }
  return failures;
}

}  // namespace parity
