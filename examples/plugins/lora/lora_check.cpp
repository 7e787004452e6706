// The checks ctest runs on the out-of-tree lora plugin (tests/lora_plugin/run.cmake),
// one mode per process, since a plugin once loaded stays loaded:
//   lora_check parity PLAN [sp]  LoRA fine-tuning at 2 and 4 thread ranks
//                                equals one process in float64 (1e-10):
//                                output, adapter gradients, adapters after
//                                Adam steps, base unchanged, merged weights,
//                                adapters saved alone and loaded again
//   lora_check missing DIR       a plan asking for plugin lora from a folder
//                                without it: the loader's error at the rule
//   lora_check rank PLAN         lora_B of another rank than lora_A: one line
//                                naming the parameter
// Exit status 0 when every check holds; each failure prints one line.
#include <torch/torch.h>

#include <functional>
#include <iostream>
#include <map>
#include <string>

#include "lora_linear.h"
#include "shardplan/communicator.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"
#include "tiny_model.h"

namespace {

using shardplan::StateDict;
constexpr double kTol = 1e-10;
constexpr int kSteps = 5;
constexpr int64_t kBatch = 3, kSeq = 4, kIn = 16, kHidden = 24, kOut = 12, kRank = 4;
int failures = 0;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  std::cerr << "FAIL: " << what << "\n";
  ++failures;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return 1e30;
  return a.numel() ? (a - b).abs().max().item<double>() : 0.0;
}

// Every tensor of `got` equals `want`'s of that name, and the names agree.
void expect_same(const StateDict& got, const StateDict& want, const std::string& what) {
  std::map<std::string, at::Tensor> by_name(want.begin(), want.end());
  expect(got.size() == want.size(), what + ": " + std::to_string(got.size()) + " tensors, expected " +
                                        std::to_string(want.size()));
  for (const auto& kv : got) {
    auto it = by_name.find(kv.first);
    const double d = it == by_name.end() ? 1e30 : max_diff(kv.second, it->second);
    expect(d <= kTol, what + ": '" + kv.first + "' differs by " + std::to_string(d));
  }
}

// Collected tensors of a replicated parameter may be the live ones, which
// later steps change.
StateDict cloned(StateDict dict) {
  for (auto& kv : dict) kv.second = kv.second.detach().clone();
  return dict;
}

lora::TinyLoRA make_reference() {
  torch::manual_seed(0);
  lora::TinyLoRA model(kIn, kHidden, kOut, kRank, 8.0);
  model->to(torch::kDouble);
  // A fresh lora_B is zero, which would leave lora_A's gradient zero too.
  torch::NoGradGuard no_grad;
  for (auto* fc : {&model->fc1, &model->fc2}) (*fc)->lora_B.normal_(0, 0.5);
  return model;
}

// What fine-tuning produced, as whole tensors.
struct Run {
  at::Tensor output, trained_output, merged_output;
  StateDict initial, grads, trained, adapters, merged;
};

// The tensors of the model, whole (collected) and cloned; its gradients.
struct Collect {
  std::function<StateDict()> state, grads, adapters;
};

Run fine_tune(lora::TinyLoRAImpl& model, const at::Tensor& x, const at::Tensor& target, const Collect& collect) {
  Run run;
  run.initial = collect.state();
  torch::optim::Adam adam(lora::freeze_base(model), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < kSteps; ++step) {
    adam.zero_grad();
    at::Tensor y = model.forward(x);
    // A sum over this rank's positions: under sequence parallelism the
    // ranks' losses add up to the whole one.
    (0.5 * (y - target).pow(2).sum()).backward();
    if (step == 0) {
      run.output = y.detach().clone();
      run.grads = collect.grads();
    }
    adam.step();
  }
  run.trained = collect.state();
  run.adapters = collect.adapters();
  run.trained_output = model.forward(x).detach().clone();
  model.merge();
  run.merged = collect.state();
  run.merged_output = model.forward(x).detach().clone();
  return run;
}

StateDict adapters_of(const StateDict& state) {
  StateDict out;
  for (const auto& kv : state)
    if (lora::is_adapter(kv.first)) out.push_back(kv);
  return out;
}

Run run_unsharded(const lora::TinyLoRA& reference, const at::Tensor& x, const at::Tensor& target) {
  auto model = std::dynamic_pointer_cast<lora::TinyLoRAImpl>(reference->clone());
  auto state = [&] { return cloned(shardplan::local_state_dict(*model)); };
  auto grads = [&] {
    StateDict g;
    for (auto& p : model->named_parameters())
      if (p.value().grad().defined()) g.emplace_back(p.key(), p.value().grad().clone());
    return g;
  };
  return fine_tune(*model, x, target, {state, grads, [&] { return adapters_of(state()); }});
}

// This rank's part of the sequence (dim 1) under sequence parallelism.
at::Tensor part(const at::Tensor& t, bool sp, int rank, int ranks) {
  return sp ? shardplan::shard_of(t, 1, ranks, rank) : t;
}

// Fine-tunes at `ranks` thread ranks; also saves the adapters alone and
// loads the unsharded run's into a fresh model, whose output must be the
// trained one. Returns each rank's run.
std::vector<Run> run_sharded(const lora::TinyLoRA& reference, const shardplan::Plan& plan, int ranks, bool sp,
                             const at::Tensor& x, const at::Tensor& target, std::vector<at::Tensor>& reloaded) {
  std::vector<Run> runs(ranks);
  reloaded.assign(ranks, at::Tensor());
  shardplan::run_ranks_in_threads(ranks, [&](shardplan::World& world) {
    const int rank = world.rank();
    auto model = std::dynamic_pointer_cast<lora::TinyLoRAImpl>(reference->clone());
    const auto report = shardplan::parallelize(*model, plan, world);
    Collect collect{[&] { return cloned(shardplan::collect_state_dict(*model, report, world, -1)); },
                    [&] { return cloned(shardplan::collect_gradients(*model, report, world, -1)); },
                    [&] { return lora::adapter_state_dict(*model, report, world, -1); }};
    const at::Tensor xr = part(x, sp, rank, ranks);
    runs[rank] = fine_tune(*model, xr, part(target, sp, rank, ranks), collect);
    auto fresh = std::dynamic_pointer_cast<lora::TinyLoRAImpl>(reference->clone());
    const auto fresh_report = shardplan::parallelize(*fresh, plan, world);
    lora::load_adapters(*fresh, fresh_report, lora::read_adapters("adapters_1.pt"));
    torch::NoGradGuard no_grad;
    reloaded[rank] = fresh->forward(xr);
  });
  return runs;
}

// What the reference itself must show, or the comparisons prove little:
// gradients for the 4 adapters alone, none zero; merge() is W + (alpha/r) B A
// and leaves the output as it was.
void check_reference(const Run& want) {
  expect(want.grads.size() == 4, "unsharded: gradients of the 4 adapters alone, got " +
                                     std::to_string(want.grads.size()));
  for (const auto& kv : want.grads) expect(kv.second.abs().max().item<double>() > 1e-3, "zero gradient " + kv.first);
  std::map<std::string, at::Tensor> trained(want.trained.begin(), want.trained.end());
  std::map<std::string, at::Tensor> merged(want.merged.begin(), want.merged.end());
  for (const std::string p : {"fc1.", "fc2."}) {
    const at::Tensor expected = trained.at(p + "weight") + 2.0 * trained.at(p + "lora_B").mm(trained.at(p + "lora_A"));
    expect(max_diff(merged.at(p + "weight"), expected) <= 1e-12, "unsharded merge of " + p + "weight");
  }
  expect(max_diff(want.merged_output, want.trained_output) <= kTol, "unsharded: merged output differs");
}

// One sharded run against the reference: each rank's outputs, then rank 0's
// collected tensors (every rank collected the same whole ones).
void check_sharded(const Run& want, const std::vector<Run>& runs, const std::vector<at::Tensor>& reloaded, bool sp,
                   const std::string& at) {
  const int ranks = static_cast<int>(runs.size());
  for (int r = 0; r < ranks; ++r) {
    const std::string who = at + ", rank " + std::to_string(r);
    expect(max_diff(runs[r].output, part(want.output, sp, r, ranks)) <= kTol, who + ": output differs");
    expect(max_diff(runs[r].merged_output, part(want.trained_output, sp, r, ranks)) <= kTol,
           who + ": merged model's output differs");
    expect(max_diff(reloaded[r], part(want.trained_output, sp, r, ranks)) <= kTol,
           who + ": output with reloaded adapters differs");
  }
  const Run& got = runs[0];
  expect_same(got.grads, want.grads, at + ": gradients");
  expect_same(got.trained, want.trained, at + ": after " + std::to_string(kSteps) + " Adam steps");
  expect_same(got.adapters, want.adapters, at + ": adapters alone");
  expect_same(got.merged, want.merged, at + ": merged");
  std::map<std::string, at::Tensor> initial(got.initial.begin(), got.initial.end());
  for (const auto& kv : got.trained) {
    const double moved = max_diff(kv.second, initial.at(kv.first));
    if (lora::is_adapter(kv.first))
      expect(moved > 1e-3, at + ": adapter '" + kv.first + "' did not train");
    else
      expect(moved == 0.0, at + ": frozen '" + kv.first + "' changed by " + std::to_string(moved));
  }
}

void check_parity(const std::string& plan_file, bool sp) {
  const auto plan = shardplan::load_plan(plan_file);
  const auto reference = make_reference();
  torch::manual_seed(1);
  const at::Tensor x = torch::randn({kBatch, kSeq, kIn}, torch::kDouble);
  const at::Tensor target = torch::randn({kBatch, kSeq, kOut}, torch::kDouble);
  const Run want = run_unsharded(reference, x, target);
  lora::save_adapters(want.adapters, "adapters_1.pt");
  check_reference(want);
  for (int ranks : {2, 4}) {
    std::vector<at::Tensor> reloaded;
    const auto runs = run_sharded(reference, plan, ranks, sp, x, target, reloaded);
    check_sharded(want, runs, reloaded, sp, plan_file + " at " + std::to_string(ranks) + " ranks");
  }
}

// Runs parallelize at 2 ranks and returns its error ("" when none).
std::string parallelize_error(const lora::TinyLoRA& model, const shardplan::Plan& plan) {
  try {
    shardplan::run_ranks_in_threads(2, [&](shardplan::World& world) {
      auto copy = std::dynamic_pointer_cast<lora::TinyLoRAImpl>(model->clone());
      shardplan::parallelize(*copy, plan, world);
    });
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

void expect_error(const std::string& error, const std::vector<std::string>& parts) {
  std::cout << "error: " << error << "\n";
  for (const auto& p : parts) expect(error.find(p) != std::string::npos, "error lacks '" + p + "': " + error);
  expect(error.find('\n') == std::string::npos, "error is not one line: " + error);
}

void check_missing(const std::string& empty_dir) {
  const auto plan = shardplan::parse_plan(
      "mesh: {model: auto}\nplugins: [.]\nrules:\n"
      "  - {match: 'fc1\\.weight', layout: [model, null], plugin: lora}\n",
      "missing.yaml", empty_dir);
  expect_error(parallelize_error(make_reference(), plan),
               {"missing.yaml:4:", "no layer plugin 'lora'", "libshardplan_layer_lora.so not found", empty_dir});
}

void check_rank(const std::string& plan_file) {
  auto model = make_reference();
  shardplan::replace_parameter(*model->fc1, "lora_B", torch::zeros({kHidden, kRank + 1}, torch::kDouble));
  expect_error(parallelize_error(model, shardplan::load_plan(plan_file)),
               {"parameter 'fc1.lora_B'", "rank r 5", "lora_A's rank r 4"});
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 2 ? argv[1] : "";
  try {
    if (mode == "parity")
      check_parity(argv[2], argc > 3 && std::string(argv[3]) == "sp");
    else if (mode == "missing")
      check_missing(argv[2]);
    else if (mode == "rank")
      check_rank(argv[2]);
    else {
      std::cerr << "usage: lora_check parity PLAN [sp] | missing EMPTY_DIR | rank PLAN\n";
      return 2;
    }
  } catch (const std::exception& e) {
    std::cerr << "FAIL: " << e.what() << "\n";
    return 1;
  }
  if (failures) return 1;
  std::cout << "lora_check " << mode << ": ok\n";
  return 0;
}
