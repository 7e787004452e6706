// parallelize_script: TorchScript modules scripted by tests/script/make_models.py
// (run here with Debian's python3-torch; skipped without it), sharded on
// thread ranks, against the same module unsharded: outputs, parameter
// gradients and parameters after optimizer steps, in float64.
#include <array>

#include "script/script_test_util.h"

namespace test_script {

using namespace shardplan;
using namespace script_test;
// parity.h has a namespace parity that a unity batch may bring in.
using script_test::parity;

namespace {

const char* kMlpPlan = R"(
mesh: {model: auto}
rules:
  - {match: 'fc1\.weight', layout: [model, null], output: sharded}
  - {match: 'fc2\.weight', layout: [null, model], input: sharded}
  - {match: 'fc3\.weight', layout: [model, null]}
  - {match: 'fc4\.weight', layout: [null, model]}
)";

const char* kTiedPlan = R"(
mesh: {model: auto}
rules:
  - {match: 'emb\.weight', layout: [model, null]}
  - {match: 'head\.weight', layout: [model, null]}
)";


const char* kTwoMethodsPlan = R"(
mesh: {model: auto}
rules:
  - {match: 'fc1\.weight', layout: [model, null]}
  - {match: 'fc2\.weight', layout: [null, model]}
)";

}  // namespace

class ScriptParity : public ::testing::TestWithParam<int> {};

TEST_P(ScriptParity, MlpSgd) {
  REQUIRE_MODELS();
  expect_parity(parity("mlp.pt", kMlpPlan, GetParam(), float_inputs({5, 12}, 10), false));
}

TEST_P(ScriptParity, MlpAdam) {
  REQUIRE_MODELS();
  expect_parity(parity("mlp.pt", kMlpPlan, GetParam(), float_inputs({5, 12}, 10), true));
}

TEST_P(ScriptParity, GptHeadParallelSgd) {
  REQUIRE_MODELS();
  expect_parity(parity("gpt.pt", kGptPlan, GetParam(), id_inputs(48, 10), false));
}

TEST_P(ScriptParity, GptHeadParallelAdam) {
  REQUIRE_MODELS();
  expect_parity(parity("gpt.pt", kGptPlan, GetParam(), id_inputs(48, 10), true));
}

TEST_P(ScriptParity, TiedEmbeddingAndHead) {
  REQUIRE_MODELS();
  expect_parity(parity("tied.pt", kTiedPlan, GetParam(), id_inputs(48, 10), true));
}

// Python's outputs on its probes (make_models.py's *_io.pt), unsharded and
// sharded.
TEST_P(ScriptParity, MatchesPythonOutputs) {
  REQUIRE_MODELS();
  const std::vector<std::array<std::string, 3>> models = {
      {"mlp.pt", "mlp_io.pt", kMlpPlan}, {"gpt.pt", "gpt_io.pt", kGptPlan}, {"tied.pt", "tied_io.pt", kTiedPlan}};
  for (const auto& [file, io, plan] : models) {
    const PythonParity p = python_parity(file, io, plan, GetParam());
    EXPECT_LT(p.unsharded, 1e-10) << file;
    EXPECT_LT(p.sharded, 1e-10) << file;
  }
}

// A module that has already run has optimized graphs cached, which a rewrite
// would not reach; parallelize_script works on a clone whose methods never
// ran, so running the module first changes nothing.
TEST(Script, ModuleThatHasRunIsShardedThroughAClone) {
  REQUIRE_MODELS();
  torch::jit::Module original = load(dir, "gpt.pt");
  const torch::Tensor ids = id_inputs(48, 1)[0];
  for (int i = 0; i < 3; ++i) original.forward({ids});  // the profiling executor optimizes after a few runs
  const torch::Tensor want = original.forward({ids}).toTensor().detach();
  const Plan plan = parse_plan(kGptPlan, "gpt.yaml");
  std::vector<double> diffs(2, 1e300);
  std::vector<int64_t> local_rows(2);
  run_ranks_in_threads(2, [&](World& world) {
    ScriptParallel sp = parallelize_script(original, plan, world);
    diffs[world.rank()] = (sp.module->forward({ids}).toTensor().detach() - want).abs().max().item<double>();
    local_rows[world.rank()] = sp.module->attr("tok_emb").toModule().attr("weight").toTensor().size(0);
  });
  EXPECT_LT(std::max(diffs[0], diffs[1]), 1e-10);
  EXPECT_EQ(local_rows, (std::vector<int64_t>{24, 24}));
}

// q, k and v read one input value: one copy_to serves the three (its
// backward all-reduces their input gradients once), as for the fused qkv.
TEST(Script, OneCopyToPerInputValue) {
  REQUIRE_MODELS();
  const torch::jit::Module original = load(dir, "gpt.pt");
  const Plan plan = parse_plan(kGptPlan, "gpt.yaml");
  std::vector<int> copies(2), columns(2);
  run_ranks_in_threads(2, [&](World& world) {
    ScriptParallel sp = parallelize_script(original, plan, world);
    const auto g = sp.module->get_method("forward").graph();
    for (const torch::jit::Node* n : g->nodes()) {
      copies[world.rank()] += n->kind().toQualString() == std::string("shardplan::copy_to");
      columns[world.rank()] += n->kind() == torch::jit::aten::linear;
    }
  });
  // Column-parallel reads: q, k, v, fc1 (block 0), qkv, fc1 (block 1), head;
  // their inputs: each block's ln1 and ln2 outputs, and ln_f's.
  EXPECT_EQ(copies, (std::vector<int>{5, 5}));
  EXPECT_EQ(columns, (std::vector<int>{11, 11})) << "the linears counted are not the model's";
}

TEST(Script, EveryNamedMethodIsRewritten) {
  REQUIRE_MODELS();
  torch::jit::Module original = load(dir, "two_methods.pt");
  const torch::Tensor x = float_inputs({5, 12}, 1)[0];
  const torch::Tensor want_forward = original.forward({x}).toTensor().detach();
  const torch::Tensor want_hidden = original.get_method("hidden")({x}).toTensor().detach();
  ScriptOptions options;
  options.methods = {"forward", "hidden"};
  std::vector<double> diffs(2, 1e300);
  run_ranks_in_threads(2, [&](World& world) {
    ScriptParallel sp = parallelize_script(original, parse_plan(kTwoMethodsPlan, "p.yaml"), world, options);
    const torch::Tensor f = sp.module->forward({x}).toTensor().detach();
    const torch::Tensor h = sp.module->get_method("hidden")({x}).toTensor().detach();
    diffs[world.rank()] = h.sizes() == want_hidden.sizes()
                              ? std::max((f - want_forward).abs().max().item<double>(),
                                         (h - want_hidden).abs().max().item<double>())
                              : 1e300;
  });
  EXPECT_LT(std::max(diffs[0], diffs[1]), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ScriptParity, ::testing::Values(2, 4));

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

TEST(ScriptErrors, UnnamedMethodReadingASplitParameter) {
  REQUIRE_MODELS();
  expect_contains(error_of("two_methods.pt", kTwoMethodsPlan),
                  {"parameter 'fc1.weight'", "p.yaml:4:", "method 'hidden' reads it (", "linear.py:",
                   "ScriptOptions::methods"});
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

}  // namespace test_script
