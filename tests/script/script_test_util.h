#pragma once
// What the TorchScript tests share (test_script*.cpp):
// the models of tests/script/make_models.py, generated once, and a module
// trained sharded on thread ranks against itself unsharded.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "shardplan/checkpoint.h"
#include "shardplan/plan.h"
#include "shardplan/script.h"
#include "shardplan/world.h"

namespace script_test {

namespace fs = std::filesystem;
using namespace shardplan;


inline std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The models, generated once per generator text: ctest runs each test in its
// own process, and they share the folder (written aside, then renamed).
// "" when python3-torch is missing.
inline std::string models_dir() {
  static std::once_flag once;
  static std::string dir;
  static std::string failure;
  std::call_once(once, [] {
    const fs::path gen = fs::path(SHARDPLAN_SOURCE_DIR) / "tests/script/make_models.py";
    const fs::path out = fs::path(SHARDPLAN_BINARY_DIR) / "tests/script_models";
    const std::string text = read_text(gen);
    if (fs::exists(out / "stamp") && read_text(out / "stamp") == text) {
      dir = out.string();
      return;
    }
    const fs::path tmp = out.string() + ".tmp" + std::to_string(getpid());
    fs::remove_all(tmp);
    const std::string cmd = "/usr/bin/python3 '" + gen.string() + "' '" + tmp.string() + "' > '" + tmp.string() +
                            ".log' 2>&1";
    const int rc = std::system(cmd.c_str());
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) return;
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
      failure = "make_models.py failed: " + read_text(tmp.string() + ".log");
      return;
    }
    std::ofstream(tmp / "stamp") << text;
    std::error_code ec;
    fs::remove_all(out, ec);
    fs::rename(tmp, out, ec);  // another process may have won: its folder is as good
    fs::remove_all(tmp, ec);
    dir = out.string();
  });
  if (!failure.empty()) throw std::runtime_error(failure);
  return dir;
}

#define REQUIRE_MODELS()                                                        \
  const std::string dir = models_dir();                                         \
  if (dir.empty()) GTEST_SKIP() << "python3-torch (/usr/bin/python3) not found"

inline torch::jit::Module load(const std::string& dir, const std::string& name) {
  return torch::jit::load(dir + "/" + name);
}

// The tensors of a file torch.save wrote: one tensor, or a tuple or list of them.
inline std::vector<torch::Tensor> load_saved_tensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const c10::IValue v = torch::pickle_load(bytes);
  if (v.isTensor()) return {v.toTensor()};
  std::vector<torch::Tensor> out;
  for (const auto& e : v.isTuple() ? v.toTupleRef().elements().vec() : v.toListRef().vec()) out.push_back(e.toTensor());
  return out;
}

inline std::vector<torch::Tensor> params_of(const torch::jit::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) {
    bool seen = false;
    for (const auto& q : out) seen = seen || q.is_same(p);
    if (!seen) out.push_back(p);
  }
  return out;
}

inline std::unique_ptr<torch::optim::Optimizer> optimizer(const torch::jit::Module& m, bool adam) {
  // Attention's key bias has a gradient of exactly zero in exact arithmetic
  // (softmax ignores a constant added to a row of scores), so it is rounding
  // noise, which Adam divides by its own size: eps 1e-6 keeps that noise from
  // turning into 1e-10 steps, and a sharding bug still moves far more.
  if (adam)
    return std::make_unique<torch::optim::Adam>(params_of(m), torch::optim::AdamOptions(1e-2).eps(1e-6));
  // 0.01: at 0.03 and above, ten steps on the Llama model amplify a change
  // of 1e-13 in one weight to 1e-6 even unsharded (measured in Python), so
  // the comparison would measure chaos, not sharding.
  return std::make_unique<torch::optim::SGD>(params_of(m), torch::optim::SGDOptions(0.01));
}

using StateMap = std::map<std::string, torch::Tensor>;

// What one run records: each step's output, the first step's gradients, the
// parameters after the last step.
struct Trace {
  std::vector<torch::Tensor> outputs;
  StateMap grads, final_state;
};

// A loss every output element weighs into differently. Bounded (tanh), so
// ten SGD steps do not grow the outputs until rounding differences turn
// into chaos, as a loss linear in them does.
inline torch::Tensor loss_of(const torch::Tensor& y) {
  auto w = torch::sin(torch::arange(y.numel(), y.options()).reshape(y.sizes()) * 0.37) + 0.5;
  return (torch::tanh(y) * w).sum();
}

// Each step's forward arguments (a module whose forward takes one tensor
// gets one per step).
using Steps = std::vector<std::vector<torch::Tensor>>;

inline Steps one_per_step(const std::vector<torch::Tensor>& inputs) {
  Steps out;
  for (const auto& x : inputs) out.push_back({x});
  return out;
}

// `loss_out`: the output is the loss (the module computes it), backwarded as is.
inline Trace train(torch::jit::Module& m, const Steps& inputs, bool adam, bool loss_out = false) {
  Trace t;
  auto opt = optimizer(m, adam);
  for (size_t s = 0; s < inputs.size(); ++s) {
    opt->zero_grad();
    torch::Tensor y = m.forward(std::vector<c10::IValue>(inputs[s].begin(), inputs[s].end())).toTensor();
    (loss_out ? y : loss_of(y)).backward();
    t.outputs.push_back(y.detach().clone());
    if (s == 0)
      for (const auto& p : m.named_parameters())  // one without a gradient is missing: max_diff 1e300
        if (p.value.grad().defined()) t.grads[p.name] = p.value.grad().detach().clone();
    opt->step();
  }
  for (const auto& kv : script_state_dict(m)) t.final_state[kv.first] = kv.second.clone();
  return t;
}

inline double max_diff(const StateMap& a, const StateMap& b) {
  double d = 0;
  for (const auto& [k, v] : b) {
    auto it = a.find(k);
    if (it == a.end() || it->second.sizes() != v.sizes()) return 1e300;
    d = std::max(d, (it->second - v).abs().max().item<double>());
  }
  return a.size() == b.size() ? d : 1e300;
}

struct Parity {
  double outputs = 0, grads = 0, params = 0;
  std::vector<ParallelReport> reports;
};

// The module sharded on `ranks` thread ranks against itself unsharded
// (`loss_out`: its output is its loss).
inline Parity parity(const std::string& file, const std::string& plan_yaml, int ranks, const Steps& inputs, bool adam,
                     const ScriptOptions& options = {}, bool loss_out = false) {
  const std::string dir = models_dir();
  torch::jit::Module reference = load(dir, file);
  const Trace want = train(reference, inputs, adam, loss_out);
  const torch::jit::Module original = load(dir, file);
  const Plan plan = parse_plan(plan_yaml, file + ".yaml");
  Parity out;
  out.reports.resize(ranks);
  std::mutex mu;
  run_ranks_in_threads(ranks, [&](World& world) {
    ScriptParallel sp = parallelize_script(original, plan, world, options);
    Trace got = train(*sp.module, inputs, adam, loss_out);
    StateMap want_grads;  // this rank's pieces of the whole gradients
    for (const auto& kv : relocate_state_dict(StateDict(want.grads.begin(), want.grads.end()), sp.report))
      want_grads[kv.first] = kv.second;
    StateMap collected;
    for (const auto& kv : collect_state_dict(script_state_dict(*sp.module), sp.report, world, -1))
      collected[kv.first] = kv.second;
    std::lock_guard<std::mutex> lock(mu);
    for (size_t s = 0; s < inputs.size(); ++s)
      out.outputs = std::max(out.outputs, got.outputs[s].sizes() == want.outputs[s].sizes()
                                              ? (got.outputs[s] - want.outputs[s]).abs().max().item<double>()
                                              : 1e300);
    out.grads = std::max(out.grads, max_diff(got.grads, want_grads));
    out.params = std::max(out.params, max_diff(collected, want.final_state));
    out.reports[world.rank()] = sp.report;
  });
  return out;
}

inline Parity parity(const std::string& file, const std::string& plan_yaml, int ranks,
                     const std::vector<torch::Tensor>& inputs, bool adam, const ScriptOptions& options = {}) {
  return parity(file, plan_yaml, ranks, one_per_step(inputs), adam, options);
}

inline std::vector<torch::Tensor> float_inputs(std::vector<int64_t> shape, int steps) {
  torch::manual_seed(1);
  std::vector<torch::Tensor> out;
  for (int s = 0; s < steps; ++s) out.push_back(torch::randn(shape, torch::kDouble));
  return out;
}

inline std::vector<torch::Tensor> id_inputs(int64_t vocab, int steps) {
  torch::manual_seed(2);
  std::vector<torch::Tensor> out;
  for (int s = 0; s < steps; ++s) out.push_back(torch::randint(vocab, {3, 6}, torch::kLong));
  return out;
}

inline void expect_parity(const Parity& p) {
  EXPECT_LT(p.outputs, 1e-10) << "grads " << p.grads << ", parameters " << p.params;
  EXPECT_LT(p.grads, 1e-10) << "outputs " << p.outputs << ", parameters " << p.params;
  EXPECT_LT(p.params, 1e-10) << "outputs " << p.outputs << ", grads " << p.grads;
}

// Python's output on its probe (`io_file`: a tuple of the probe, then the
// output, as make_models.py saves it) against the module run here: unsharded,
// and on every one of `ranks` thread ranks sharded by `plan_yaml` (outputs
// gathered). So the C++ side runs the model Python ran, not only the same
// model twice. The rank figure is the largest over ranks (1e300 for a rank
// whose output has another shape).
struct PythonParity {
  double unsharded = 1e300, sharded = 1e300;
};

inline PythonParity python_parity(const std::string& file, const std::string& io_file, const std::string& plan_yaml,
                                  int ranks) {
  const std::string dir = models_dir();
  const std::vector<torch::Tensor> io = load_saved_tensors(dir + "/" + io_file);
  if (io.size() != 2) throw std::runtime_error(io_file + ": expected (probe, output)");
  const torch::Tensor &probe = io[0], &want = io[1];
  auto diff = [&](const torch::Tensor& y) {
    return y.sizes() == want.sizes() ? (y.detach() - want).abs().max().item<double>() : 1e300;
  };
  torch::jit::Module unsharded = load(dir, file);
  PythonParity out;
  out.unsharded = diff(unsharded.forward({probe}).toTensor());
  const Plan plan = parse_plan(plan_yaml, file + ".yaml");
  std::vector<double> diffs(ranks, 1e300);
  run_ranks_in_threads(ranks, [&](World& world) {
    ScriptParallel sp = parallelize_script(unsharded, plan, world);
    diffs[world.rank()] = diff(sp.module->forward({probe}).toTensor());
  });
  out.sharded = *std::max_element(diffs.begin(), diffs.end());
  return out;
}

// The first rank's error, or "" when every rank succeeded.
inline std::string error_of(const std::string& file, const std::string& plan_yaml, int ranks = 2,
                            const ScriptOptions& options = {}) {
  const torch::jit::Module original = load(models_dir(), file);
  try {
    const Plan plan = parse_plan(plan_yaml, "p.yaml");
    run_ranks_in_threads(ranks, [&](World& world) { parallelize_script(original, plan, world, options); });
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

inline void expect_contains(const std::string& e, const std::vector<std::string>& parts) {
  for (const auto& part : parts) EXPECT_NE(e.find(part), std::string::npos) << "no '" << part << "' in: " << e;
}

// The GPT twins head-parallel: the plan every one is sharded by.
inline const std::string kGptPlan =
    read_text(fs::path(SHARDPLAN_SOURCE_DIR) / "tests/script/gpt_head_parallel.yaml");

// kGptPlan with its divide line replaced by `divide` ("" drops it), plus a rule.
inline std::string gpt_plan_with(const std::string& divide, const std::string& extra_rule = "") {
  std::string plan = kGptPlan;
  plan.replace(plan.find("divide:"), plan.find('\n', plan.find("divide:")) - plan.find("divide:"), divide);
  return plan + extra_rule;
}

}  // namespace script_test
