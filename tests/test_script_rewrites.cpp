// The rewrite registry of parallelize_script (shardplan/script_rewrite.h):
// linears written as x @ W.t() + b and torch.addmm(b, x, W.t()) through the
// built-in aten::t rewrite, and a user's rewrite for an op the kernel does
// not handle, each against the module unsharded in float64.
#include <torch/csrc/jit/ir/ir.h>

#include <atomic>

#include "script/script_test_util.h"
#include "shardplan/script_rewrite.h"

namespace test_script_rewrites {

using namespace shardplan;
using namespace script_test;
// parity.h has a namespace parity that a unity batch may bring in.
using script_test::parity;

namespace {

const char* kMatmulPlan = R"(
mesh: {model: auto}
rules:
  - {match: 'w1', layout: [model, null], output: sharded}
  - {match: 'w2', layout: [null, model], input: sharded}
  - {match: 'w3', layout: [model, null]}
  - {match: 'w4', layout: [null, model]}
)";

const char* kScaledPlan = R"(
mesh: {model: auto}
rules:
  - {match: 'fc1\.weight', layout: [model, null], output: sharded}
  - {match: 'scale', layout: [model]}
  - {match: 'fc2\.weight', layout: [null, model], input: sharded}
)";

std::map<std::string, ReportRow> rows_of(const ParallelReport& r) {
  std::map<std::string, ReportRow> rows;
  for (const auto& row : r.rows) rows[row.path] = row;
  return rows;
}

}  // namespace

class ScriptRewriteRanks : public ::testing::TestWithParam<int> {};

TEST_P(ScriptRewriteRanks, MatmulAndAddmmSgd) {
  REQUIRE_MODELS();
  const Parity p = parity("matmul_mlp.pt", kMatmulPlan, GetParam(), float_inputs({5, 12}, 10), false);
  expect_parity(p);
  auto rows = rows_of(p.reports[0]);
  const int64_t n = GetParam();
  EXPECT_EQ(rows.at("w1").local_shape, (std::vector<int64_t>{32 / n, 12}));
  EXPECT_EQ(rows.at("b1").local_shape, (std::vector<int64_t>{32 / n}));  // added to the sharded output
  EXPECT_EQ(rows.at("w2").local_shape, (std::vector<int64_t>{12, 32 / n}));
  EXPECT_EQ(rows.at("b2").local_shape, (std::vector<int64_t>{12}));      // added after the reduction
  EXPECT_EQ(rows.at("b3").local_shape, (std::vector<int64_t>{16 / n}));  // inside the column addmm
  EXPECT_EQ(rows.at("b4").local_shape, (std::vector<int64_t>{8}));
  EXPECT_EQ(rows.at("w3").note, "column-parallel (aten::addmm of W.t())");
  EXPECT_EQ(rows.at("b1").note, "follows 'w1'");
  EXPECT_EQ(rows.at("b1").layout, "[model]");
}

TEST_P(ScriptRewriteRanks, MatmulAndAddmmAdam) {
  REQUIRE_MODELS();
  expect_parity(parity("matmul_mlp.pt", kMatmulPlan, GetParam(), float_inputs({5, 12}, 10), true));
}

INSTANTIATE_TEST_SUITE_P(Ranks, ScriptRewriteRanks, ::testing::Values(2, 4));

TEST(ScriptRewrites, RowAddmmBiasSplitRefused) {
  REQUIRE_MODELS();
  const std::string e = error_of("matmul_mlp.pt", std::string(kMatmulPlan) + "  - {match: 'b2', layout: [model]}\n");
  expect_contains(e, {"p.yaml:", "'b2'", "aten::addmm", "added after the reduction"});
}

TEST(ScriptRewrites, UnknownOpNamedWithTheRegisteredReads) {
  REQUIRE_MODELS();
  // fc1's weight is read by aten::linear; `scale` by aten::mul, which has no
  // built-in rewrite: the error names the op, its source and what is registered.
  const std::string e = error_of("scaled_mlp.pt", kScaledPlan);
  expect_contains(e, {"'scale'", "aten::mul", "make_models.py:", "aten::linear (input 1)", "aten::t (input 0)"});
}

// A user's rewrite: a per-feature scale of a sharded activation is cut with
// it and needs no communication. Registered once for the process, so the
// refusal above is checked first in the same test.
TEST(ScriptRewrites, UserRewriteForAnOpTheKernelDoesNotHandle) {
  REQUIRE_MODELS();
  EXPECT_NE(error_of("scaled_mlp.pt", kScaledPlan), "");
  ScriptRewrite scale;
  scale.name = "feature scale";
  scale.decide = [](const ScriptRead& r) {
    if (r.layout.size() != 1) throw Error("a feature scale is 1-D");
    ScriptCut cut;
    cut.note = "scale of sharded features (aten::mul)";
    return cut;
  };
  static std::atomic<int> applied{0};  // the registry outlives the test; ranks are threads
  scale.apply = [](const ScriptRead& r, const ScriptCut&, ScriptGraphEdit& e) {
    EXPECT_EQ(std::string(r.node->kind().toQualString()), "aten::mul");
    EXPECT_GT(e.parts(), 1);
    ++applied;
  };
  register_script_rewrite("aten::mul", 1, scale);
  EXPECT_NE(script_rewrite_keys().find("aten::mul (input 1)"), std::string::npos);
  for (int ranks : {2, 4}) {
    const Parity p = parity("scaled_mlp.pt", kScaledPlan, ranks, float_inputs({5, 12}, 3), false);
    expect_parity(p);
    EXPECT_EQ(rows_of(p.reports[0]).at("scale").local_shape, (std::vector<int64_t>{32 / ranks}));
    EXPECT_EQ(rows_of(p.reports[0]).at("scale").note, "scale of sharded features (aten::mul)");
  }
  EXPECT_EQ(applied.load(), 2 + 4);
}

}  // namespace test_script_rewrites
