// parallelize_script on modules whose forward reads parameters through
// another attribute (an RNN's _flat_weights list): every parameter the
// forward reads must be the one the optimizer steps. Each RNN kind of
// tests/script/make_models.py beside planned linears, trained sharded on
// thread ranks against the unsharded module; verify_script's gradient
// comparison; collect_gradients and unique_parameters for scripted modules.
#include <sys/stat.h>
#include <torch/csrc/jit/ir/ir.h>

#include <cstdio>

#include "script/script_test_util.h"
#include "shardplan/script_rewrite.h"

namespace test_script_rnn {

using namespace shardplan;
using namespace script_test;
using script_test::parity;

namespace {

// fc1/fc2 and fc3/fc4 Megatron pairs around an RNN no rule names.
const char* kRnnPlan = R"(
mesh: {model: auto}
rules:
  - {match: 'fc1\.weight', layout: [model, null], output: sharded}
  - {match: 'fc2\.weight', layout: [null, model], input: sharded}
  - {match: 'fc3\.weight', layout: [model, null], output: sharded}
  - {match: 'fc4\.weight', layout: [null, model], input: sharded}
)";

// The name whose tensors differ most (for failure messages).
std::string worst_of(const StateMap& got, const StateMap& want) {
  std::string worst = "none";
  double d = -1;
  for (const auto& [k, v] : want) {
    auto it = got.find(k);
    const double here = it == got.end() || it->second.sizes() != v.sizes() ? 1e300
                                                                          : (it->second - v).abs().max().item<double>();
    if (here > d) d = here, worst = k + " (" + std::to_string(here) + ")";
  }
  return worst;
}

// A batch of 3 sequences of 5 steps of 12 features, one per step.
std::vector<torch::Tensor> sequences(int steps) { return float_inputs({3, 5, 12}, steps); }

// Trains `original` sharded by kRnnPlan on `ranks` thread ranks with Adam,
// one step per input, and expects every parameter to get a gradient, step
// 1's collected gradients to be `want.grads` and the parameters after the
// last step `want.final_state` (float64, 1e-10).
void expect_trains_like(const torch::jit::Module& original, const std::vector<torch::Tensor>& inputs,
                        const Trace& want, int ranks) {
  const Plan plan = parse_plan(kRnnPlan, "rnn.yaml");
  std::mutex mu;
  std::vector<std::string> missing;
  std::vector<double> grad_diff(ranks, 1e300), param_diff(ranks, 1e300);
  std::vector<std::string> grad_worst(ranks);
  run_ranks_in_threads(ranks, [&](World& world) {
    ScriptParallel sp = parallelize_script(original, plan, world);
    torch::jit::Module& m = *sp.module;
    torch::optim::Adam adam(unique_parameters(m), torch::optim::AdamOptions(1e-2).eps(1e-6));
    StateMap grads;
    for (const auto& x : inputs) {
      adam.zero_grad();
      loss_of(m.forward({x}).toTensor()).backward();
      if (grads.empty())
        for (const auto& kv : collect_gradients(m, sp.report, world, -1)) grads[kv.first] = kv.second;
      adam.step();
    }
    StateMap state;
    for (const auto& kv : collect_state_dict(script_state_dict(m), sp.report, world, -1)) state[kv.first] = kv.second;
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& p : m.named_parameters())
      if (!p.value.grad().defined()) missing.push_back(p.name + " on rank " + std::to_string(world.rank()));
    grad_diff[world.rank()] = max_diff(grads, want.grads);
    grad_worst[world.rank()] = worst_of(grads, want.grads);
    param_diff[world.rank()] = max_diff(state, want.final_state);
  });
  EXPECT_TRUE(missing.empty()) << "no gradient: " << missing.front();
  for (int r = 0; r < ranks; ++r) {
    EXPECT_LT(grad_diff[r], 1e-10) << "rank " << r << ": " << grad_worst[r];
    EXPECT_LT(param_diff[r], 1e-10) << "rank " << r;
  }
}

}  // namespace

class ScriptRnn : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// Before the fix, every rnn.* gradient was undefined on every rank (the
// forward read the clone's tensors in _flat_weights) and Adam moved tensors
// the forward never read: the parameters after three steps differed by 1e-2.
TEST_P(ScriptRnn, TrainsLikeTheUnshardedModule) {
  REQUIRE_MODELS();
  const auto& [kind, ranks] = GetParam();
  const std::string file = kind + "_net.pt";
  torch::jit::Module reference = load(dir, file);
  const std::vector<torch::Tensor> inputs = sequences(3);  // seeded: made once, not by racing ranks
  const Trace want = train(reference, one_per_step(inputs), true);
  ASSERT_EQ(want.grads.size(), reference.named_parameters().size());
  expect_trains_like(load(dir, file), inputs, want, ranks);
}

// PyTorch's own run (make_models.py's <kind>_train.pt: its three inputs,
// step 1's gradients and the parameters after three Adam steps, eager, in
// the module's parameter order), so the sharded module trains as the model
// Python trained, not only as the same graph run twice here.
TEST_P(ScriptRnn, TrainsLikePyTorch) {
  REQUIRE_MODELS();
  const auto& [kind, ranks] = GetParam();
  const torch::jit::Module original = load(dir, kind + "_net.pt");
  const std::vector<torch::Tensor> saved = load_saved_tensors(dir + "/" + kind + "_train.pt");
  std::vector<std::string> names;
  for (const auto& p : original.named_parameters()) names.push_back(p.name);
  const size_t n = names.size();
  ASSERT_EQ(saved.size(), 3 + 2 * n);
  Trace want;
  for (size_t i = 0; i < n; ++i) {
    want.grads[names[i]] = saved[3 + i];
    want.final_state[names[i]] = saved[3 + n + i];
  }
  expect_trains_like(original, {saved.begin(), saved.begin() + 3}, want, ranks);
}

// The shared parity harness too: outputs, this rank's gradients, parameters.
TEST_P(ScriptRnn, ParityWithAdam) {
  REQUIRE_MODELS();
  const auto& [kind, ranks] = GetParam();
  expect_parity(parity(kind + "_net.pt", kRnnPlan, ranks, sequences(3), true));
}

INSTANTIATE_TEST_SUITE_P(Kinds, ScriptRnn,
                         ::testing::Combine(::testing::Values("gru", "lstm", "rnn"), ::testing::Values(2, 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param));
                         });

// A split parameter that another attribute also holds would be read whole
// there: refused, naming both.
TEST(ScriptRnnRefusals, SplitParameterHeldByAListRefused) {
  REQUIRE_MODELS();
  const std::string e = error_of("cached_weight.pt", R"(
mesh: {model: auto}
rules:
  - {match: 'fc1\.weight', layout: [model, null]}
)");
  expect_contains(e, {"p.yaml:4:", "'fc1.weight'", "attribute 'cache'", "leave the parameter replicated"});
}

// An RNN's own weights are read only through _flat_weights: a plan that
// splits one is refused, saying so.
TEST(ScriptRnnRefusals, SplitRnnWeightRefused) {
  REQUIRE_MODELS();
  const std::string e = error_of("gru_net.pt", R"(
mesh: {model: auto}
rules:
  - {match: 'rnn\.weight_ih_l0', layout: [model, null]}
)");
  expect_contains(e, {"p.yaml:4:", "'rnn.weight_ih_l0'", "never read by name", "_flat_weights"});
}

// torch.einsum takes its operands as a list: the op named is einsum, with
// the Python line, not the list's construction.
TEST(ScriptRnnRefusals, EinsumReadNamesTheOpAndItsLine) {
  REQUIRE_MODELS();
  const std::string e = error_of("einsum.pt", R"(
mesh: {model: auto}
rules:
  - {match: 'w', layout: [model, null]}
)");
  expect_contains(e, {"p.yaml:4:", "parameter 'w'", "aten::einsum (input 1, in a list) at ", "make_models.py:"});
  EXPECT_EQ(e.find("ListConstruct"), std::string::npos) << e;
  EXPECT_EQ(e.find("<unknown source>"), std::string::npos) << e;
}

TEST(ScriptRnnVerify, GruPassesWithEveryGradientCompared) {
  REQUIRE_MODELS();
  const auto v = verify_script(load(dir, "gru_net.pt"), parse_plan(kRnnPlan, "rnn.yaml"), 2, sequences(1));
  EXPECT_TRUE(v.passed()) << v.str();
  EXPECT_EQ(v.gradients.size(), load(dir, "gru_net.pt").named_parameters().size());
  bool rnn_seen = false;
  for (const auto& g : v.gradients) rnn_seen = rnn_seen || g.name == "gradient of 'rnn.weight_ih_l0'";
  EXPECT_TRUE(rnn_seen);
  expect_contains(v.str(), {"gradients of ", " parameters: largest difference"});
}

// The comparison itself: a rewrite that feeds its op a detached copy of the
// parameter (as the GRU's stale _flat_weights did) leaves the forward right
// and the parameter without a gradient, which verify reports.
TEST(ScriptRnnVerify, ParameterWithoutGradientReported) {
  REQUIRE_MODELS();
  ScriptRewrite detaching;
  detaching.name = "detaching divisor";
  detaching.decide = [](const ScriptRead&) {
    ScriptCut cut;
    cut.note = "divisor of sharded features, detached";
    return cut;
  };
  detaching.apply = [](const ScriptRead& r, const ScriptCut&, ScriptGraphEdit& e) {
    torch::jit::WithInsertPoint at(r.node);
    torch::jit::Value* copy = e.graph().insert(torch::jit::aten::detach, {r.node->input(r.input)});
    r.node->replaceInput(r.input, copy);
  };
  register_script_rewrite("aten::div", 1, detaching);
  const auto v = verify_script(load(dir, "divided_mlp.pt"), parse_plan(R"(
mesh: {model: auto}
rules:
  - {match: 'fc1\.weight', layout: [model, null], output: sharded}
  - {match: 'gate', layout: [model]}
  - {match: 'fc2\.weight', layout: [null, model], input: sharded}
)", "p.yaml"), 2, {torch::randn({4, 12}, torch::kDouble)});
  EXPECT_FALSE(v.passed());
  for (const auto& o : v.outputs) EXPECT_LT(o.max_diff, 1e-12) << o.name;  // the forward is right
  expect_contains(v.str(), {"gradient of 'gate' [32]: none on rank ", "FAILED at 2 ranks"});
}

// A refused plan compared nothing: the error alone, no "largest difference".
TEST(ScriptRnnVerify, RefusedPlanPrintsOnlyTheError) {
  REQUIRE_MODELS();
  const auto v = verify_script(load(dir, "einsum.pt"), parse_plan("mesh: {model: auto}\nrules:\n"
                                                                  "  - {match: 'w', layout: [model, null]}\n", "p.yaml"),
                               2, {torch::randn({4, 12}, torch::kDouble)});
  EXPECT_FALSE(v.passed());
  EXPECT_EQ(v.str().find("largest difference"), std::string::npos) << v.str();
  EXPECT_EQ(v.str().find('\n'), std::string::npos) << v.str();
  expect_contains(v.str(), {"the sharded module failed at 2 ranks: ", "aten::einsum"});
}

TEST(ScriptRnnApi, UniqueParametersListsATiedTensorOnce) {
  REQUIRE_MODELS();
  const torch::jit::Module tied = load(dir, "tied.pt");
  const std::vector<torch::Tensor> unique = unique_parameters(tied);
  EXPECT_EQ(unique.size() + 1, tied.parameters().size());
  EXPECT_EQ(unique.size(), params_of(tied).size());
}

// head_sized.pt: an attention `attn` with one fused qkv projection (4 heads of 6, head_dim read by
// the views) and a row-parallel proj.
std::string head_plan(const std::string& divide) {
  return "mesh: {model: auto}\n" + divide +
         "rules:\n"
         "  - {match: 'attn\\.qkv\\.weight', layout: [model, null], output: sharded, blocks: 3}\n"
         "  - {match: 'attn\\.proj\\.weight', layout: [null, model], input: sharded}\n";
}

TEST(ScriptRnnHeads, DividedHeadCountTrainsLikeUnsharded) {
  REQUIRE_MODELS();
  for (int ranks : {2, 4})
    expect_parity(parity("head_sized.pt", head_plan("divide: {attn: [n_head]}\n"), ranks, float_inputs({2, 5, 24}, 3),
                         true));
}

// Dividing the head size instead of the count runs (4 heads of 3 on each
// rank's 12 rows) and is wrong: refused at the rule, naming both sizes.
TEST(ScriptRnnHeads, DividedHeadSizeRefusedNamingBothSizes) {
  REQUIRE_MODELS();
  const std::string e = error_of("head_sized.pt", head_plan("divide: {attn: [head_dim]}\n"));
  expect_contains(e, {"p.yaml:4:", "'attn.qkv.weight'", "head size of 6 (head_dim)", "n_head = 4 heads of 3",
                      "after the divide at p.yaml:2:"});
}

TEST(ScriptRnnHeads, ForgottenDivideRefusedNamingBothSizes) {
  REQUIRE_MODELS();
  const std::string e = error_of("head_sized.pt", head_plan(""), 4);
  expect_contains(e, {"p.yaml:3:", "head size of 6 (head_dim)", "n_head = 4 heads", "the plan has no divide"});
}

// docs/TORCHSCRIPT.md's thread-ranks example, verbatim between the markers.
shardplan::StateDict docs_example(const std::string& file, const std::string& plan_file,
                                  const std::vector<torch::Tensor>& batches) {
  shardplan::StateDict last_gradients;
  // --- docs begin
  const torch::jit::Module model = shardplan::load_script_module(file);   // "model.pt"
  const shardplan::Plan plan = shardplan::load_plan(plan_file);            // "plan.yaml"
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& world) {
    shardplan::ScriptParallel sp = shardplan::parallelize_script(model, plan, world);
    torch::optim::Adam adam(shardplan::unique_parameters(*sp.module), torch::optim::AdamOptions(1e-3));
    for (const torch::Tensor& x : batches) {
      adam.zero_grad();
      sp.module->forward({x}).toTensor().pow(2).mean().backward();
      adam.step();
    }
    shardplan::StateDict grads = shardplan::collect_gradients(*sp.module, sp.report, world);  // on rank 0
    if (world.rank() == 0) last_gradients = grads;
  });
  // --- docs end
  return last_gradients;
}

TEST(ScriptRnnApi, DocsThreadRanksExample) {
  REQUIRE_MODELS();
  const std::string plan_file = dir + "/rnn_plan" + std::to_string(getpid()) + ".yaml";
  std::ofstream(plan_file) << kRnnPlan;
  const shardplan::StateDict grads = docs_example(dir + "/gru_net.pt", plan_file, sequences(2));
  std::remove(plan_file.c_str());
  EXPECT_EQ(grads.size(), load(dir, "gru_net.pt").named_parameters().size());
  // The docs show the same lines.
  const std::string doc = read_text(fs::path(SHARDPLAN_SOURCE_DIR) / "docs/TORCHSCRIPT.md");
  const std::string me = read_text(fs::path(SHARDPLAN_SOURCE_DIR) / "tests/test_script_rnn.cpp");
  const auto begin = me.find("// --- docs begin\n") + 18, end = me.find("  // --- docs end");
  std::stringstream body(me.substr(begin, end - begin));
  for (std::string line; std::getline(body, line);)
    EXPECT_NE(doc.find(line.substr(2) + "\n"), std::string::npos) << "not in docs/TORCHSCRIPT.md: " << line;
}

// A torch.save state dict, a text file, a missing file and a named pipe
// (which torch::jit::load would block on): one line naming the file, not
// libtorch's message and backtrace.
TEST(ScriptRnnApi, LoadNamesTheFileInOneLine) {
  REQUIRE_MODELS();
  const std::string fifo = dir + "/pipe" + std::to_string(getpid()) + ".pt";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string text = std::string(SHARDPLAN_SOURCE_DIR) + "/tests/script/make_models.py";
  for (const std::string& file : {dir + "/state_dict.pt", text, dir + "/missing.pt", fifo}) {
    std::string e;
    try {
      load_script_module(file);
    } catch (const Error& err) {
      e = err.what();
    }
    EXPECT_NE(e.find("'" + file + "'"), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  std::remove(fifo.c_str());
}

}  // namespace test_script_rnn
