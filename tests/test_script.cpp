// parallelize_script: TorchScript modules scripted by tests/script/make_models.py
// (run here with Debian's python3-torch; skipped without it), sharded on
// thread ranks, against the same module unsharded: outputs, parameter
// gradients and parameters after optimizer steps, in float64.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "shardplan/checkpoint.h"
#include "shardplan/plan.h"
#include "shardplan/script.h"
#include "shardplan/world.h"

namespace fs = std::filesystem;
using namespace shardplan;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The models, generated once per generator text: ctest runs each test in its
// own process, and they share the folder (written aside, then renamed).
// "" when python3-torch is missing.
std::string models_dir() {
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

torch::jit::Module load(const std::string& dir, const std::string& name) {
  return torch::jit::load(dir + "/" + name);
}

std::vector<torch::Tensor> params_of(const torch::jit::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) {
    bool seen = false;
    for (const auto& q : out) seen = seen || q.is_same(p);
    if (!seen) out.push_back(p);
  }
  return out;
}

std::unique_ptr<torch::optim::Optimizer> optimizer(const torch::jit::Module& m, bool adam) {
  // Attention's key bias has a gradient of exactly zero in exact arithmetic
  // (softmax ignores a constant added to a row of scores), so it is rounding
  // noise, which Adam divides by its own size: eps 1e-6 keeps that noise from
  // turning into 1e-10 steps, and a sharding bug still moves far more.
  if (adam)
    return std::make_unique<torch::optim::Adam>(params_of(m), torch::optim::AdamOptions(1e-2).eps(1e-6));
  return std::make_unique<torch::optim::SGD>(params_of(m), torch::optim::SGDOptions(0.1));
}

using StateMap = std::map<std::string, torch::Tensor>;

// What one run records: each step's output, the first step's gradients, the
// parameters after the last step.
struct Trace {
  std::vector<torch::Tensor> outputs;
  StateMap grads, final_state;
};

// A loss every output element weighs into differently.
torch::Tensor loss_of(const torch::Tensor& y) {
  auto w = torch::sin(torch::arange(y.numel(), y.options()).reshape(y.sizes()) * 0.37) + 0.5;
  return (y * w).sum();
}

Trace train(torch::jit::Module& m, const std::vector<torch::Tensor>& inputs, bool adam) {
  Trace t;
  auto opt = optimizer(m, adam);
  for (size_t s = 0; s < inputs.size(); ++s) {
    opt->zero_grad();
    torch::Tensor y = m.forward({inputs[s]}).toTensor();
    loss_of(y).backward();
    t.outputs.push_back(y.detach().clone());
    if (s == 0)
      for (const auto& p : m.named_parameters()) t.grads[p.name] = p.value.grad().detach().clone();
    opt->step();
  }
  for (const auto& kv : script_state_dict(m)) t.final_state[kv.first] = kv.second.clone();
  return t;
}

double max_diff(const StateMap& a, const StateMap& b) {
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

// The module sharded on `ranks` thread ranks against itself unsharded.
Parity parity(const std::string& file, const std::string& plan_yaml, int ranks,
              const std::vector<torch::Tensor>& inputs, bool adam) {
  const std::string dir = models_dir();
  torch::jit::Module reference = load(dir, file);
  const Trace want = train(reference, inputs, adam);
  const torch::jit::Module original = load(dir, file);
  const Plan plan = parse_plan(plan_yaml, file + ".yaml");
  Parity out;
  out.reports.resize(ranks);
  std::mutex mu;
  run_ranks_in_threads(ranks, [&](World& world) {
    ScriptParallel sp = parallelize_script(original, plan, world);
    Trace got = train(*sp.module, inputs, adam);
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

std::vector<torch::Tensor> float_inputs(std::vector<int64_t> shape, int steps) {
  torch::manual_seed(1);
  std::vector<torch::Tensor> out;
  for (int s = 0; s < steps; ++s) out.push_back(torch::randn(shape, torch::kDouble));
  return out;
}

std::vector<torch::Tensor> id_inputs(int64_t vocab, int steps) {
  torch::manual_seed(2);
  std::vector<torch::Tensor> out;
  for (int s = 0; s < steps; ++s) out.push_back(torch::randint(vocab, {3, 6}, torch::kLong));
  return out;
}

void expect_parity(const Parity& p) {
  EXPECT_LT(p.outputs, 1e-10);
  EXPECT_LT(p.grads, 1e-10);
  EXPECT_LT(p.params, 1e-10);
}

const char* kMlpPlan = R"(
mesh: {model: auto}
rules:
  - {match: 'fc1\.weight', layout: [model, null], output: sharded}
  - {match: 'fc2\.weight', layout: [null, model], input: sharded}
  - {match: 'fc3\.weight', layout: [model, null]}
  - {match: 'fc4\.weight', layout: [null, model]}
)";

const char* kGptPlan = R"(
mesh: {model: auto}
divide: {'blocks\.\d+\.attn': [n_head]}
rules:
  - {match: 'tok_emb\.weight', layout: [model, null]}
  - {match: 'blocks\.\d+\.attn\.(q|k|v)\.weight', layout: [model, null], output: sharded}
  - {match: 'blocks\.\d+\.attn\.qkv\.weight', layout: [model, null], output: sharded, blocks: 3}
  - {match: 'blocks\.\d+\.attn\.proj\.weight', layout: [null, model], input: sharded}
  - {match: 'blocks\.\d+\.fc1\.weight', layout: [model, null], output: sharded}
  - {match: 'blocks\.\d+\.fc2\.weight', layout: [null, model], input: sharded}
  - {match: 'head\.weight', layout: [model, null]}
)";

const char* kTiedPlan = R"(
mesh: {model: auto}
rules:
  - {match: 'emb\.weight', layout: [model, null]}
  - {match: 'head\.weight', layout: [model, null]}
)";

}  // namespace

class ScriptParity : public ::testing::TestWithParam<int> {};

TEST_P(ScriptParity, MlpSgd) {
  REQUIRE_MODELS();
  expect_parity(parity("mlp.pt", kMlpPlan, GetParam(), float_inputs({5, 12}, 3), false));
}

TEST_P(ScriptParity, MlpAdam) {
  REQUIRE_MODELS();
  expect_parity(parity("mlp.pt", kMlpPlan, GetParam(), float_inputs({5, 12}, 3), true));
}

TEST_P(ScriptParity, GptHeadParallelSgd) {
  REQUIRE_MODELS();
  expect_parity(parity("gpt.pt", kGptPlan, GetParam(), id_inputs(48, 3), false));
}

TEST_P(ScriptParity, GptHeadParallelAdam) {
  REQUIRE_MODELS();
  expect_parity(parity("gpt.pt", kGptPlan, GetParam(), id_inputs(48, 3), true));
}

TEST_P(ScriptParity, TiedEmbeddingAndHead) {
  REQUIRE_MODELS();
  expect_parity(parity("tied.pt", kTiedPlan, GetParam(), id_inputs(48, 3), true));
}

INSTANTIATE_TEST_SUITE_P(Ranks, ScriptParity, ::testing::Values(2, 4));

namespace {

// The first rank's error, or "" when every rank succeeded.
std::string error_of(const std::string& file, const std::string& plan_yaml, int ranks = 2) {
  const torch::jit::Module original = load(models_dir(), file);
  try {
    const Plan plan = parse_plan(plan_yaml, "p.yaml");
    run_ranks_in_threads(ranks, [&](World& world) { parallelize_script(original, plan, world); });
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

void expect_contains(const std::string& e, const std::vector<std::string>& parts) {
  for (const auto& part : parts) EXPECT_NE(e.find(part), std::string::npos) << "no '" << part << "' in: " << e;
}

std::string gpt_plan_with(const std::string& divide, const std::string& extra_rule = "") {
  std::string plan = kGptPlan;
  plan.replace(plan.find("divide:"), plan.find('\n', plan.find("divide:")) - plan.find("divide:"), divide);
  return plan + extra_rule;
}

}  // namespace

TEST(Script, ReportSplitsAndOriginalUntouched) {
  REQUIRE_MODELS();
  const torch::jit::Module original = load(dir, "gpt.pt");
  const torch::Tensor qkv = original.attr("blocks").toModule().attr("1").toModule().attr("attn").toModule()
                                .attr("qkv").toModule().attr("weight").toTensor().clone();
  const Plan plan = parse_plan(kGptPlan, "gpt.yaml");
  std::vector<ParallelReport> reports(2);
  std::vector<int64_t> heads(2);
  run_ranks_in_threads(2, [&](World& world) {
    ScriptParallel sp = parallelize_script(original, plan, world);
    reports[world.rank()] = sp.report;
    heads[world.rank()] = sp.module->attr("blocks").toModule().attr("0").toModule().attr("attn").toModule()
                              .attr("n_head").toInt();
  });
  EXPECT_EQ(heads, (std::vector<int64_t>{2, 2}));
  auto attn = original.attr("blocks").toModule().attr("0").toModule().attr("attn").toModule();
  EXPECT_EQ(attn.attr("n_head").toInt(), 4);
  EXPECT_TRUE(original.attr("blocks").toModule().attr("1").toModule().attr("attn").toModule().attr("qkv")
                  .toModule().attr("weight").toTensor().equal(qkv));
  std::map<std::string, ReportRow> rows;
  for (const auto& r : reports[1].rows) rows[r.path] = r;
  const ReportRow& q = rows.at("blocks.1.attn.qkv.weight");
  EXPECT_EQ(q.global_shape, (std::vector<int64_t>{72, 24}));
  EXPECT_EQ(q.local_shape, (std::vector<int64_t>{36, 24}));
  ASSERT_EQ(q.splits.size(), 1u);
  EXPECT_EQ(q.splits[0].blocks, 3);
  EXPECT_EQ(q.splits[0].index, 1);
  EXPECT_EQ(q.plugin, "script");
  EXPECT_NE(q.rule.find("gpt.yaml:"), std::string::npos);
  const ReportRow& qb = rows.at("blocks.1.attn.qkv.bias");
  EXPECT_EQ(qb.layout, "[model]");
  EXPECT_EQ(qb.local_shape, (std::vector<int64_t>{36}));
  EXPECT_EQ(rows.at("blocks.0.attn.proj.weight").local_shape, (std::vector<int64_t>{24, 12}));
  EXPECT_EQ(rows.at("blocks.0.attn.proj.bias").local_shape, (std::vector<int64_t>{24}));
  EXPECT_TRUE(rows.at("blocks.0.attn.proj.bias").splits.empty());
  EXPECT_EQ(rows.at("tok_emb.weight").local_shape, (std::vector<int64_t>{24, 24}));
  EXPECT_EQ(rows.at("pos_emb").local_shape, (std::vector<int64_t>{6, 24}));
  EXPECT_LT(reports[0].local_bytes(), reports[0].global_bytes());
}

TEST(Script, TiedRowsShareOneTensor) {
  REQUIRE_MODELS();
  Parity p = parity("tied.pt", kTiedPlan, 2, id_inputs(48, 1), false);
  std::map<std::string, ReportRow> rows;
  for (const auto& r : p.reports[0].rows) rows[r.path] = r;
  ASSERT_TRUE(rows.count("head.weight"));
  EXPECT_EQ(rows.at("head.weight").tied_to, "emb.weight");
  EXPECT_EQ(rows.at("head.weight").local_shape, (std::vector<int64_t>{24, 24}));
}

TEST(ScriptErrors, ParameterReadByAnUnknownOp) {
  REQUIRE_MODELS();
  const std::string e = error_of("gpt.pt", gpt_plan_with("", "  - {match: 'pos_emb', layout: [model, null]}\n"));
  expect_contains(e, {"p.yaml:", "'pos_emb'", "aten::slice", "make_models.py:"});
}

TEST(ScriptErrors, DivideAttributeMissing) {
  REQUIRE_MODELS();
  const std::string e = error_of("gpt.pt", gpt_plan_with("divide: {'blocks\\.\\d+\\.attn': [n_heads]}"));
  expect_contains(e, {"'n_heads'", "does not exist", "p.yaml:3:"});
}

TEST(ScriptErrors, DivideAttributeConstant) {
  REQUIRE_MODELS();
  const std::string e = error_of("gpt_const.pt", kGptPlan);
  expect_contains(e, {"'n_head'", "is a constant"});
}

TEST(ScriptErrors, DivideAttributeNotDivisible) {
  REQUIRE_MODELS();
  const std::string plan = gpt_plan_with("divide: {'blocks\\.\\d+\\.attn': [n_head, head_dim]}");
  const std::string e = error_of("gpt.pt", plan, 4);
  expect_contains(e, {"'head_dim'", "= 6 is not divisible by 4"});
}

TEST(ScriptErrors, DivideAttributeNeverRead) {
  REQUIRE_MODELS();
  const std::string e = error_of("gpt.pt", gpt_plan_with("divide: {'blocks\\.\\d+\\.attn': [n_head, n_embd]}"));
  expect_contains(e, {"'n_embd'", "never read"});
}

TEST(ScriptErrors, DividePatternMatchesNoModule) {
  REQUIRE_MODELS();
  const std::string e = error_of("gpt.pt", gpt_plan_with("divide: {'blocks\\.\\d+\\.attention': [n_head]}"));
  expect_contains(e, {"matches no module"});
}

TEST(ScriptErrors, FrozenModule) {
  REQUIRE_MODELS();
  const std::string e = error_of("mlp_frozen.pt", "mesh: {model: auto}\nstrict: false\nrules: []\n");
  expect_contains(e, {"frozen"});
}

TEST(ScriptErrors, TiedPlannedDifferently) {
  REQUIRE_MODELS();
  std::string plan = kTiedPlan;
  plan.replace(plan.rfind("[model, null]"), 13, "[null, model]");
  const std::string e = error_of("tied.pt", plan);
  expect_contains(e, {"tied", "different layouts"});
}

TEST(ScriptErrors, RowBiasSplit) {
  REQUIRE_MODELS();
  std::string plan = kMlpPlan;
  plan += "  - {match: 'fc2\\.bias', layout: [model]}\n";
  const std::string e = error_of("mlp.pt", plan);
  expect_contains(e, {"'fc2.bias'", "added after the reduction"});
}

TEST(ScriptPlan, DivideRoundTripsAndRejectsBadValues) {
  const Plan p = parse_plan(kGptPlan, "gpt.yaml");
  ASSERT_EQ(p.divide.size(), 1u);
  EXPECT_EQ(p.divide[0].attributes, (std::vector<std::string>{"n_head"}));
  EXPECT_TRUE(p.divide[0].matches("blocks.12.attn"));
  EXPECT_FALSE(p.divide[0].matches("blocks.12.attn.q"));
  const Plan again = parse_plan(p.to_yaml());
  ASSERT_EQ(again.divide.size(), 1u);
  EXPECT_EQ(again.divide[0].pattern, p.divide[0].pattern);
  EXPECT_EQ(again.to_yaml(), p.to_yaml());
  for (const char* bad : {"divide: [n_head]", "divide: {'a': []}", "divide: {'a': [1head]}", "divide: {'a': [n, n]}"}) {
    const std::string text = std::string("mesh: {model: 2}\n") + bad + "\nrules: []\nstrict: false\n";
    try {
      parse_plan(text, "d.yaml");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const PlanError& e) {
      EXPECT_NE(std::string(e.what()).find("d.yaml:2:"), std::string::npos) << e.what();
    }
  }
}
