// Ranks agree on the plan and the model before sharding (shardplan/agreement.h):
// the comparison itself, and parallelize() on ranks as threads that disagree.
// The same through the launcher with real processes: tests/faults.cmake.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <mutex>

#include "shardplan/agreement.h"
#include "shardplan/error.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace test_agreement {

namespace {

using shardplan::AgreementDigest;
using shardplan::nn::Linear;

struct NetImpl : torch::nn::Module {
  NetImpl(int64_t in, int64_t hidden, int64_t out, bool extra = false) {
    fc1 = register_module("fc1", Linear(in, hidden));
    fc2 = register_module("fc2", Linear(hidden, out));
    if (extra) fc3 = register_module("fc3", Linear(out, out));
  }
  Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Net);

const char* const kPlan =
    "mesh: {model: auto}\n"
    "rules:\n"
    "  - {match: 'fc1\\.weight', layout: [model, null], output: sharded}\n"
    "  - {match: 'fc1\\.bias', layout: [model]}\n"
    "  - {match: 'fc2\\.weight', layout: [null, model], input: sharded}\n";

// kPlan with fc2's input replicated instead: rule 3 differs.
const char* const kOtherPlan =
    "mesh: {model: auto}\n"
    "rules:\n"
    "  - {match: 'fc1\\.weight', layout: [model, null], output: sharded}\n"
    "  - {match: 'fc1\\.bias', layout: [model]}\n"
    "  - {match: 'fc2\\.weight', layout: [null, model], input: replicated}\n";

shardplan::Plan plan(const char* text, const std::string& name = "a.yaml") { return shardplan::parse_plan(text, name); }

AgreementDigest digest(Net net, const char* text = kPlan, const std::string& name = "a.yaml") {
  return AgreementDigest::of(*net, plan(text, name));
}

TEST(Agreement, EqualModelsAndPlansAgree) {
  auto a = digest(Net(8, 16, 4)), b = digest(Net(8, 16, 4), kPlan, "elsewhere/b.yaml");
  EXPECT_EQ(a.hash(), b.hash());  // the plan's path is not compared
  EXPECT_EQ(shardplan::first_disagreement({a, b, a}), "");
  ASSERT_EQ(a.params.size(), 4u);
  EXPECT_EQ(a.params[2].path, "fc2.weight");
  EXPECT_EQ(a.params[2].shape, (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(a.params[2].dtype, "float32");
}

TEST(Agreement, SerializeRoundTrips) {
  auto a = digest(Net(8, 16, 4), kPlan, "plans/x.yaml");
  auto b = AgreementDigest::parse(a.serialize());
  EXPECT_EQ(b.plan_source, "plans/x.yaml");
  EXPECT_EQ(b.plan_lines, a.plan_lines);
  EXPECT_EQ(b.hash(), a.hash());
  EXPECT_EQ(b.serialize(), a.serialize());
}

TEST(Agreement, ShapeDifferenceNamesParameterAndShapes) {
  auto a = digest(Net(8, 48, 32)), b = digest(Net(8, 64, 32));
  EXPECT_NE(a.hash(), b.hash());
  // fc1 differs first: [48, 8] vs [64, 8].
  EXPECT_EQ(shardplan::first_disagreement({a, a, b}),
            "rank 2's model has parameter 'fc1.weight' [64, 8] float32 where rank 0 has [48, 8] float32");
}

TEST(Agreement, DtypeDifference) {
  Net n(8, 16, 4);
  n->to(torch::kDouble);
  EXPECT_EQ(shardplan::first_disagreement({digest(Net(8, 16, 4)), digest(n)}),
            "rank 1's model has parameter 'fc1.weight' [16, 8] float64 where rank 0 has [16, 8] float32");
}

TEST(Agreement, ExtraOrMissingParameter) {
  auto a = digest(Net(8, 16, 4)), b = digest(Net(8, 16, 4, /*extra=*/true));
  EXPECT_EQ(
      shardplan::first_disagreement({a, b}),
      "rank 1's model has 6 parameters where rank 0's has 4: rank 0 has no parameter 'fc3.weight' [4, 4] float32");
  EXPECT_EQ(
      shardplan::first_disagreement({b, a}),
      "rank 1's model has 4 parameters where rank 0's has 6: rank 1 has no parameter 'fc3.weight' [4, 4] float32");
}

TEST(Agreement, DifferentNames) {
  auto a = digest(Net(8, 16, 4));
  auto b = a;
  b.params[1].path = "fc1.b";
  EXPECT_EQ(shardplan::first_disagreement({a, b}),
            "rank 1's model has parameter 'fc1.b' [16] float32 where rank 0 has 'fc1.bias' [16] float32 "
            "(parameter #2 in named_parameters() order)");
}

TEST(Agreement, PlanDifferenceNamesTheRuleAndBothFiles) {
  auto a = digest(Net(8, 16, 4), kPlan, "a.yaml"), b = digest(Net(8, 16, 4), kOtherPlan, "b.yaml");
  EXPECT_NE(a.hash(), b.hash());
  EXPECT_EQ(shardplan::first_disagreement({a, b}),
            "rank 1 runs a different plan than rank 0: rule 3 (match: 'fc2\\.weight') differs: rank 1's plan (b.yaml) "
            "has \"input: replicated\" "
            "where rank 0's (a.yaml) has \"input: sharded\"");
  // Outside the rules: the mesh.
  auto c = digest(Net(8, 16, 4), "mesh: {tp: auto}\nrules: []\n", "c.yaml");
  auto d = digest(Net(8, 16, 4), "mesh: {model: auto}\nrules: []\n", "d.yaml");
  EXPECT_EQ(shardplan::first_disagreement({d, c}),
            "rank 1 runs a different plan than rank 0: rank 1's plan (c.yaml) has \"mesh: {tp: auto}\" where rank 0's "
            "(d.yaml) has \"mesh: {model: auto}\"");
  // A plan with one rule fewer, and the plan is reported before the model.
  auto e = digest(Net(8, 16, 3), "mesh: {model: auto}\nrules:\n  - {match: 'fc1\\.weight', layout: [model, null]}\n",
                  "e.yaml");
  auto f = digest(Net(8, 16, 4),
                  "mesh: {model: auto}\nrules:\n  - {match: 'fc1\\.weight', layout: [model, null]}\n"
                  "  - {match: 'fc1\\.bias', layout: [model]}\n",
                  "f.yaml");
  EXPECT_EQ(shardplan::first_disagreement({f, e}),
            "rank 1 runs a different plan than rank 0: rule 2 (match: 'fc1\\.bias') differs: rank 1's plan (e.yaml) "
            "has nothing more "
            "where rank 0's (f.yaml) has \"match: 'fc1\\.bias'\"");
}

TEST(Agreement, PluginDirectoriesAreNotCompared) {
  auto a = digest(Net(8, 16, 4), "mesh: {model: auto}\nplugins: [/node0/plugins]\nrules: []\n");
  auto b = digest(Net(8, 16, 4), "mesh: {model: auto}\nplugins: [/node1/plugins]\nrules: []\n");
  EXPECT_EQ(a.hash(), b.hash());
}

// parallelize() on ranks as threads: every rank throws the same one-line
// error (recorded per rank, then rethrown so a rank that fails otherwise
// aborts the others instead of leaving them waiting).
std::map<int, std::string> run_disagreeing(int n, const std::function<Net(int)>& model_of,
                                           const std::function<std::string(int)>& plan_of) {
  std::mutex mu;
  std::map<int, std::string> errors;
  try {
    shardplan::run_ranks_in_threads(
        n,
        [&](shardplan::World& w) {
          Net net = model_of(w.rank());
          const std::string text = plan_of(w.rank());
          try {
            shardplan::parallelize(*net, plan(text.c_str(), "plan" + std::to_string(w.rank()) + ".yaml"), w);
          } catch (const shardplan::Error& e) {
            std::lock_guard<std::mutex> lock(mu);
            errors[w.rank()] = e.what();
            throw;
          }
        },
        "local", {}, std::chrono::seconds(20));
  } catch (const shardplan::Error&) {
  }
  return errors;
}

TEST(Agreement, ThreadsWithDifferentModelsAllThrow) {
  auto errors = run_disagreeing(
      3, [](int r) { return r == 1 ? Net(8, 64, 32) : Net(8, 48, 32); }, [](int) { return std::string(kPlan); });
  ASSERT_EQ(errors.size(), 3u);
  const std::string expected =
      "parallelize: rank 1's model has parameter 'fc1.weight' [64, 8] float32 where rank 0 has [48, 8] float32; "
      "every rank must apply the same plan to the same model";
  for (const auto& e : errors) EXPECT_EQ(e.second, expected) << "rank " << e.first;
}

TEST(Agreement, ThreadsWithDifferentPlansAllThrow) {
  auto errors = run_disagreeing(
      2, [](int) { return Net(8, 16, 4); }, [](int r) { return std::string(r == 1 ? kOtherPlan : kPlan); });
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& e : errors) {
    EXPECT_NE(
        e.second.find("parallelize: rank 1 runs a different plan than rank 0: rule 3 (match: 'fc2\\.weight') differs"),
        std::string::npos)
        << e.second;
    EXPECT_EQ(e.second.find('\n'), std::string::npos);
  }
  EXPECT_EQ(errors[0], errors[1]);
  EXPECT_EQ(errors[0],
            "parallelize: rank 1 runs a different plan than rank 0: rule 3 (match: 'fc2\\.weight') differs: rank 1's "
            "plan (plan1.yaml) has "
            "\"input: replicated\" where rank 0's (plan0.yaml) has \"input: sharded\"; every rank must apply the same "
            "plan to the same model");
}

TEST(Agreement, AgreeingRanksPayOneSmallAllGather) {
  for (int n : {1, 2, 4}) {
    shardplan::run_ranks_in_threads(n, [&](shardplan::World& w) {
      Net net(8, 16, 4);
      w.reset_stats();
      auto report = shardplan::parallelize(*net, plan(kPlan), w);
      EXPECT_EQ(net->fc1->weight.size(0), 16 / n);
      // A group of one communicates nothing; otherwise one 8-byte hash.
      EXPECT_EQ(w.comm().stats().calls, n == 1 ? 0u : 1u);
      EXPECT_EQ(w.comm().stats().bytes, n == 1 ? 0u : 8u);
    });
  }
}

}  // namespace

}  // namespace test_agreement
