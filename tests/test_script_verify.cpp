// Verify mode of parallelize_script: traced twins of the scripted GPT
// (tests/script/make_models.py) keep no head count to divide, so they are
// sharded only after the sharded module, run on thread ranks, has matched
// the unsharded one on a probe; one whose head count the tracer baked in is
// reported with its difference and refused.
#include "script/script_test_util.h"

namespace test_script_verify {

using namespace shardplan;
using namespace script_test;
// parity.h has a namespace parity that a unity batch may bring in.
using script_test::parity;

namespace {

std::vector<at::Tensor> probe_ids() {
  torch::manual_seed(3);
  return {torch::randint(48, {3, 6}, torch::kLong)};
}

std::shared_ptr<const ScriptVerification> verified(const std::string& file, const std::string& plan_yaml, int ranks) {
  const Plan plan = parse_plan(plan_yaml, file + ".yaml");
  return std::make_shared<ScriptVerification>(verify_script(load(models_dir(), file), plan, ranks, probe_ids()));
}

ScriptOptions with(std::shared_ptr<const ScriptVerification> v) {
  ScriptOptions o;
  o.verified = std::move(v);
  return o;
}

const char* kHeadOnlyPlan = R"(
mesh: {model: auto}
rules:
  - {match: 'head\.weight', layout: [model, null]}
)";

}  // namespace

TEST(ScriptVerify, TracedDivideRefusedWithoutVerify) {
  REQUIRE_MODELS();
  const std::string e = error_of("gpt_traced.pt", kGptPlan);
  expect_contains(e, {"p.yaml:3:", "traced", "make_models.py:", "run verify first", "--probe"});
}

TEST(ScriptVerify, TracedShardedOutputRefusedWithoutVerify) {
  REQUIRE_MODELS();
  const std::string plan = gpt_plan_with("");
  const std::string e = error_of("gpt_traced.pt", plan);
  expect_contains(e, {"traced", "output: sharded", "run verify first"});
}

TEST(ScriptVerify, TracedWithGatheredOutputsNeedsNone) {
  REQUIRE_MODELS();
  EXPECT_EQ(error_of("gpt_traced.pt", kHeadOnlyPlan), "");
  expect_parity(parity("gpt_traced.pt", kHeadOnlyPlan, 2, id_inputs(48, 2), false));
}

class ScriptVerifyRanks : public ::testing::TestWithParam<int> {};

TEST_P(ScriptVerifyRanks, TracedTwinPassesThenTrainsLikeUnsharded) {
  REQUIRE_MODELS();
  const auto v = verified("gpt_traced.pt", kGptPlan, GetParam());
  EXPECT_TRUE(v->passed()) << v->str();
  EXPECT_EQ(v->dtype, "float64");
  EXPECT_EQ(v->error, "");
  ASSERT_EQ(v->outputs.size(), 1u);
  EXPECT_EQ(v->outputs[0].name, "output");
  EXPECT_EQ(v->outputs[0].shape, (std::vector<int64_t>{3, 6, 48}));
  EXPECT_LT(v->outputs[0].max_diff, 1e-12);
  EXPECT_GT(v->outputs[0].max_abs, 0.1);
  // Adam: SGD at 0.1 on this sum loss grows the parameters to ~900 in three
  // steps, where 1e-10 is below float64 rounding.
  const Parity p = parity("gpt_traced.pt", kGptPlan, GetParam(), id_inputs(48, 10), true, with(v));
  expect_parity(p);
  std::string warnings;
  for (const auto& w : p.reports[0].warnings) warnings += w + "\n";
  expect_contains(warnings, {"'n_head' of module 'blocks.0.attn'", "baked", "verified at"});
}

INSTANTIATE_TEST_SUITE_P(Ranks, ScriptVerifyRanks, ::testing::Values(2, 4));

TEST(ScriptVerify, BakedHeadCountReportedWithItsDifferenceAndRefused) {
  REQUIRE_MODELS();
  const auto v = verified("gpt_traced_baked.pt", kGptPlan, 2);
  EXPECT_FALSE(v->passed());
  EXPECT_EQ(v->error, "");  // it runs: a rank's 2 heads of 6 viewed as 4 of 3
  ASSERT_EQ(v->outputs.size(), 1u);
  EXPECT_GT(v->outputs[0].max_diff, 1e-3);
  EXPECT_LT(v->outputs[0].max_diff, 10.0);
  expect_contains(v->str(), {"output [3, 6, 48]: largest difference", "FAILED at 2"});
  const std::string e = error_of("gpt_traced_baked.pt", kGptPlan, 2, with(v));
  expect_contains(e, {"traced", "the verification failed", "largest difference"});
}

TEST(ScriptVerify, BakedHeadCountThatCannotRunIsReported) {
  REQUIRE_MODELS();
  // At 4 ranks a rank's 6 features do not view as 4 heads.
  const auto v = verified("gpt_traced_baked.pt", kGptPlan, 4);
  EXPECT_FALSE(v->passed());
  expect_contains(v->error, {"forward:"});
}


TEST(ScriptVerify, VerificationOfAnotherWorldSizeRefused) {
  REQUIRE_MODELS();
  const std::string e = error_of("gpt_traced.pt", kGptPlan, 4, with(verified("gpt_traced.pt", kGptPlan, 2)));
  expect_contains(e, {"another plan or world size (2 ranks)", "at 4"});
}

TEST(ScriptVerify, ScriptedModulePassesAndForgottenDivideIsReportedNotThrown) {
  REQUIRE_MODELS();
  EXPECT_TRUE(verified("gpt.pt", kGptPlan, 2)->passed());
  // Without the divide a rank would view its 12 q features as 4 heads of 6
  // and throw; the module states its head size, so the plan is refused
  // first, which verify reports.
  const std::string plan = gpt_plan_with("");
  const auto v = verified("gpt.pt", plan, 2);
  EXPECT_FALSE(v->passed());
  expect_contains(v->error, {"has a head size of 6 (head_dim)", "n_head = 4 heads of 3"});
  expect_contains(v->str(), {"the sharded module failed at 2 ranks: "});
}

TEST(ScriptVerify, UnshardedModuleFailingOnTheProbeThrows) {
  REQUIRE_MODELS();
  const Plan plan = parse_plan(kGptPlan, "gpt.yaml");
  try {
    verify_script(load(dir, "gpt.pt"), plan, 2, {torch::randn({3, 6})});
    ADD_FAILURE() << "a float probe of an embedding was accepted";
  } catch (const Error& e) {
    expect_contains(e.what(), {"verify: the unsharded module fails on the probe"});
  }
}

}  // namespace test_script_verify
