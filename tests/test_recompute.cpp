// Activation recomputation (shardplan/recompute.h, the plan's `recompute:`):
// the example GPT and Llama sharded on 1, 2 and 4 thread ranks under tensor,
// sequence and async tensor parallelism, with full and selective
// recomputation, against the same sharding without it: losses and every
// gradient equal in float64 to 1e-12, with attention dropout (the masks
// drawn again in backward) and without, over two backwards (the streams
// continue after a replay as they would have without one). Every run checks
// that its graph holds recomputed regions, so a plan that recomputed nothing
// could not pass. Then the plan key (parse, canonical form) and bad input.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "models/llama.h"
#include "models/model.h"
#include "parity.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/random.h"
#include "shardplan/recompute.h"
#include "shardplan/world.h"

namespace test_recompute {

namespace {

namespace ex = shardplan::examples;

std::string plan_text(const std::string& name) {
  std::ifstream in(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/" + name);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

shardplan::Plan with_recompute(const std::string& name, const std::string& recompute) {
  return shardplan::parse_plan(plan_text(name) + (recompute.empty() ? "" : "\nrecompute: " + recompute + "\n"),
                               name);
}

// Whether the graph behind `t` holds a recomputed region's node.
bool has_region(const at::Tensor& t) {
  std::vector<torch::autograd::Node*> todo{t.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (!n || !seen.insert(n).second) continue;
    if (n->name().find("RecomputeFunction") != std::string::npos) return true;
    for (const auto& e : n->next_edges()) todo.push_back(e.function.get());
  }
  return false;
}

struct RankRun {
  std::vector<double> losses;
  std::vector<std::pair<std::string, at::Tensor>> grads;
  bool regions = true;  // every loss's graph had one
};

// Two backwards on this rank's clone of `ref` (gradients accumulate), the
// tracker seeded alike for every variant.
std::vector<RankRun> run(const std::shared_ptr<torch::nn::Module>& ref, const shardplan::Plan& plan, int world,
                         const std::vector<ex::Batch>& batches) {
  std::vector<RankRun> out(world);
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    auto m = ref->clone();
    const auto report = shardplan::parallelize(*m, plan, w);
    shardplan::manual_seed(w, 1234, report.mesh);
    RankRun r;
    for (const ex::Batch& b : batches) {
      at::Tensor loss = ex::as_example(m).model->loss(b);
      r.regions = r.regions && has_region(loss);
      loss.backward();
      r.losses.push_back(loss.item<double>());
    }
    for (const auto& p : m->named_parameters())
      r.grads.emplace_back(p.key(), p.value().grad().defined() ? p.value().grad().clone() : at::Tensor());
    out[w.rank()] = std::move(r);
  });
  return out;
}

// Recomputed against not, rank by rank; "" when equal to 1e-12.
std::string compare(const std::vector<RankRun>& with, const std::vector<RankRun>& without) {
  for (size_t rank = 0; rank < with.size(); ++rank) {
    const RankRun &a = with[rank], &b = without[rank];
    const std::string at = "rank " + std::to_string(rank) + ": ";
    if (!a.regions) return at + "no recomputed region in the graph";
    for (size_t i = 0; i < a.losses.size(); ++i)
      if (std::abs(a.losses[i] - b.losses[i]) > 1e-12 * std::max(1.0, std::abs(b.losses[i])))
        return at + "loss " + std::to_string(i) + " " + std::to_string(a.losses[i]) + " vs " +
               std::to_string(b.losses[i]);
    for (size_t i = 0; i < a.grads.size(); ++i) {
      const at::Tensor &ga = a.grads[i].second, &gb = b.grads[i].second;
      if (ga.defined() != gb.defined()) return at + a.grads[i].first + ": a gradient on one side only";
      if (ga.defined() && parity::rel_err(ga, gb) > 1e-12)
        return at + a.grads[i].first + ": gradient off by " + std::to_string(parity::rel_err(ga, gb));
    }
  }
  return "";
}

std::vector<ex::Batch> token_batches(int64_t vocab, int64_t batch, int64_t context) {
  torch::manual_seed(5);
  std::vector<ex::Batch> out;
  for (int i = 0; i < 2; ++i)
    out.push_back({torch::randint(vocab, {batch, context}, torch::kLong), torch::randint(vocab, {batch, context}, torch::kLong)});
  return out;
}

// Every dim divisible by 1, 2 and 4 ranks.
std::shared_ptr<torch::nn::Module> gpt(double dropout) {
  torch::manual_seed(3);
  auto m = ex::make_model("gpt", {{"vocab", "32"},
                                  {"context", "8"},
                                  {"embed", "16"},
                                  {"heads", "4"},
                                  {"layers", "2"},
                                  {"mlp", "32"},
                                  {"dropout", std::to_string(dropout)}})
               .module;
  m->to(torch::kDouble);
  return m;
}

std::shared_ptr<torch::nn::Module> llama() {
  torch::manual_seed(3);
  auto m = ex::make_model("llama", {{"vocab", "32"},
                                    {"context", "8"},
                                    {"embed", "32"},
                                    {"heads", "4"},
                                    {"kv_heads", "4"},
                                    {"layers", "2"},
                                    {"mlp", "32"}})
               .module;
  m->to(torch::kDouble);
  return m;
}

void expect_same(const std::shared_ptr<torch::nn::Module>& ref, const std::string& plan, const std::string& recompute,
                 const std::vector<int>& worlds, const std::vector<ex::Batch>& batches) {
  for (int world : worlds) {
    const auto with = run(ref, with_recompute(plan, recompute), world, batches);
    const auto without = run(ref, with_recompute(plan, ""), world, batches);
    EXPECT_EQ(compare(with, without), "") << plan << " at " << world << " ranks, recompute: " << recompute;
  }
}

const char* const kGptFull = "['blocks\\.\\d+']";
const char* const kGptSelective = "[{module: 'blocks\\.\\d+\\.attn', mode: selective}]";
const char* const kLlamaFull = "['model\\.layers\\.\\d+']";
const char* const kLlamaSelective = "[{module: 'model\\.layers\\.\\d+\\.self_attn', mode: selective}]";

}  // namespace

TEST(Recompute, GptFullAndSelectiveEqualNoRecomputationUnderTensorParallelism) {
  for (double dropout : {0.0, 0.25})
    for (const char* rc : {kGptFull, kGptSelective})
      expect_same(gpt(dropout), "gpt.yaml", rc, {1, 2, 4}, token_batches(32, 4, 8));
}

TEST(Recompute, GptUnderSequenceParallelismAndAsyncTensorParallelism) {
  for (const char* plan : {"gpt_sp.yaml", "gpt_async.yaml"})
    for (const char* rc : {kGptFull, kGptSelective}) expect_same(gpt(0.25), plan, rc, {2, 4}, token_batches(32, 4, 8));
}

TEST(Recompute, LlamaFullAndSelectiveUnderTensorSequenceAndAsyncParallelism) {
  for (const char* plan : {"llama.yaml", "llama_sp.yaml", "llama_async.yaml"})
    for (const char* rc : {kLlamaFull, kLlamaSelective}) {
      const std::vector<int> worlds = std::string(plan) == "llama.yaml" ? std::vector<int>{1, 2, 4} : std::vector<int>{2, 4};
      expect_same(llama(), plan, rc, worlds, token_batches(32, 2, 8));
    }
}

// Full recomputation of a block that contains a selective attention: the
// inner region runs inside the outer one's replay, once.
TEST(Recompute, NestedFullAndSelectiveEqualNoRecomputation) {
  expect_same(gpt(0.25), "gpt.yaml", "['blocks\\.\\d+', {module: 'blocks\\.\\d+\\.attn', mode: selective}]", {2},
              token_batches(32, 4, 8));
}

// The replay restores the streams only for the region: a dropout mask drawn
// again after backward would repeat the region's, and the second step's
// losses would be those of the first batch's masks. Checked by the two
// backwards of every comparison; here the masks are shown to matter at all.
TEST(Recompute, DropoutMasksMatterToTheComparison) {
  const auto batches = token_batches(32, 4, 8);
  const auto with = run(gpt(0.25), with_recompute("gpt.yaml", kGptFull), 2, batches);
  const auto none = run(gpt(0.0), with_recompute("gpt.yaml", ""), 2, batches);
  EXPECT_NE(compare(with, none), "");
}

// Without a plan (or with one that names nothing to recompute) the model
// runs as it always did: no region, the same numbers bit for bit.
TEST(Recompute, WithoutTheKeyNothingIsRecomputed) {
  auto a = gpt(0.0), b = gpt(0.0);
  const auto batch = token_batches(32, 4, 8)[0];
  at::Tensor la = ex::as_example(a).model->loss(batch), lb = ex::as_example(b).model->loss(batch);
  EXPECT_FALSE(has_region(la));
  EXPECT_TRUE(la.equal(lb));
  const auto runs = run(gpt(0.0), with_recompute("gpt.yaml", ""), 2, {batch});
  EXPECT_EQ(compare(runs, runs), "rank 0: no recomputed region in the graph");
}

TEST(RecomputePlan, ParsesAndRoundTrips) {
  const auto plan = with_recompute("gpt.yaml", "['blocks\\.\\d+', {module: 'x\\.attn', mode: selective}, {module: 'y'}]");
  ASSERT_EQ(plan.recompute.size(), 3u);
  EXPECT_EQ(plan.recompute[0].mode, "full");
  EXPECT_EQ(plan.recompute[1].mode, "selective");
  EXPECT_EQ(plan.recompute[2].mode, "full");
  EXPECT_TRUE(plan.recompute[0].matches("blocks.12"));
  EXPECT_FALSE(plan.recompute[0].matches("blocks.1.attn"));
  const std::string yaml = plan.to_yaml();
  EXPECT_NE(yaml.find("recompute:\n  - 'blocks\\.\\d+'\n  - {module: 'x\\.attn', mode: selective}\n  - 'y'\n"),
            std::string::npos)
      << yaml;
  const auto again = shardplan::parse_plan(yaml);
  EXPECT_EQ(again.to_yaml(), yaml);
  EXPECT_EQ(with_recompute("gpt.yaml", "").to_yaml().find("recompute"), std::string::npos);
}

TEST(RecomputePlan, BadValuesAreErrorsAtTheirLine) {
  const std::string head = "version: 1\nmesh: {model: auto}\nrules: []\n";
  auto error = [&](const std::string& tail) {
    try {
      shardplan::parse_plan(head + tail, "p.yaml");
    } catch (const shardplan::PlanError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error("recompute: blocks").find("p.yaml:4:12: recompute must be a list"), std::string::npos)
      << error("recompute: blocks");
  EXPECT_NE(error("recompute: []").find("p.yaml:4:12: recompute must be a list"), std::string::npos);
  EXPECT_NE(error("recompute: ['a(']").find("p.yaml:4:13: invalid regex"), std::string::npos) << error("recompute: ['a(']");
  EXPECT_NE(error("recompute: [{module: a, mode: half}]").find("p.yaml:4:31: recompute mode must be full"),
            std::string::npos)
      << error("recompute: [{module: a, mode: half}]");
  EXPECT_NE(error("recompute: [{mode: full}]").find("p.yaml:4:13: a recompute entry needs module"),
            std::string::npos);
  EXPECT_NE(error("recompute: [{module: a, every: 2}]").find("p.yaml:4:25: unknown key 'every'"), std::string::npos)
      << error("recompute: [{module: a, every: 2}]");
  EXPECT_NE(error("recompute: [a, a]").find("p.yaml:4:16: duplicate pattern 'a'"), std::string::npos);
  EXPECT_NE(error("recompute: [[a]]").find("p.yaml:4:13: recompute must be a list"), std::string::npos);
}

namespace {

std::string parallelize_error(const std::shared_ptr<torch::nn::Module>& m, const shardplan::Plan& plan) {
  std::string msg = "no error";
  try {
    shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
      auto local = m->clone();
      shardplan::parallelize(*local, plan, w);
    });
  } catch (const std::exception& e) {
    msg = e.what();
  }
  return msg;
}

}  // namespace

TEST(RecomputePlan, PatternsMatchingNothingOrModulesThatCannotAreRefused) {
  const std::string none = parallelize_error(gpt(0), with_recompute("gpt.yaml", "['layers\\.\\d+']"));
  EXPECT_NE(none.find("gpt.yaml:"), std::string::npos) << none;
  EXPECT_NE(none.find("recompute pattern 'layers\\.\\d+' matched no module"), std::string::npos) << none;

  const std::string cannot = parallelize_error(gpt(0), with_recompute("gpt.yaml", "['blocks\\.\\d+\\.fc1']"));
  EXPECT_NE(cannot.find("recompute: module 'blocks.0.fc1' matched by 'blocks\\.\\d+\\.fc1' is a "
                        "shardplan::nn::LinearImpl, which cannot recompute its forward"),
            std::string::npos)
      << cannot;
  EXPECT_EQ(cannot.find('\n'), std::string::npos) << cannot;

  const std::string mode = parallelize_error(gpt(0), with_recompute("gpt.yaml", "[{module: 'blocks\\.\\d+', mode: selective}]"));
  EXPECT_NE(mode.find("is a shardplan::examples::GPTBlockImpl, which does not implement mode selective (it recomputes "
                      "its whole forward: mode: full)"),
            std::string::npos)
      << mode;
  const std::string attn = parallelize_error(gpt(0), with_recompute("gpt.yaml", "['blocks\\.\\d+\\.attn']"));
  EXPECT_NE(attn.find("does not implement mode full (selective recomputes attention's core only)"), std::string::npos)
      << attn;

  // Not strict: a warning, as for rules.
  auto lenient = with_recompute("gpt.yaml", "['layers\\.\\d+']");
  lenient.strict = false;
  EXPECT_EQ(parallelize_error(gpt(0), lenient), "no error");
}

TEST(RecomputePlan, CheckPlanListsEveryProblemAndTheReportNamesWhatIsRecomputed) {
  auto m = gpt(0);
  std::vector<std::string> errors;
  shardplan::check_plan(*m, with_recompute("gpt.yaml", "['nothing', 'blocks\\.\\d+\\.ln1']"), 2, 0, errors);
  ASSERT_EQ(errors.size(), 3u);  // ln1 of two blocks, and the pattern that matched nothing
  const auto report = shardplan::check_plan(*m, with_recompute("gpt.yaml", kGptFull), 2, 0);
  ASSERT_EQ(report.recompute.size(), 2u);
  EXPECT_EQ(report.recompute[1].path, "blocks.1");
  EXPECT_EQ(report.recompute[1].mode, "full");
  EXPECT_NE(report.table().find("recompute full: blocks.0 (shardplan::examples::GPTBlockImpl), gpt.yaml:"),
            std::string::npos)
      << report.table();
  EXPECT_NE(report.json().find("\"recompute\": [{\"path\": \"blocks.0\""), std::string::npos);
}

namespace {

// A region whose forward reads state that changes: what recomputation
// cannot replay, caught in backward.
class DriftingImpl : public torch::nn::Cloneable<DriftingImpl>, public shardplan::Recomputable {
 public:
  DriftingImpl() { reset(); }
  void reset() override { fc = register_module("fc", torch::nn::Linear(4, 4)); }
  at::Tensor forward(const at::Tensor& x) {
    return recompute_full(
        [this](const std::vector<at::Tensor>& in) { return fc->forward(in[0]) * (drift ? double(++calls) : 1.0); }, {x});
  }
  torch::nn::Linear fc{nullptr};
  bool drift = true;
  int calls = 0;
};
TORCH_MODULE(Drifting);

}  // namespace

TEST(Recompute, AForwardThatIsNotDeterministicIsOneLineInBackward) {
  Drifting d;
  d->set_recompute_mode(shardplan::RecomputeMode::full, "block");
  at::Tensor y = d->forward(torch::ones({2, 4}, torch::requires_grad())).sum();
  std::string msg = "no error";
  try {
    y.backward();
  } catch (const std::exception& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("recompute: module 'block' ("), std::string::npos) << msg;
  EXPECT_NE(msg.find("DriftingImpl) computed other outputs when recomputed in backward"), std::string::npos) << msg;
  // Deterministic, it computes what it does without recomputation.
  Drifting e;
  e->set_recompute_mode(shardplan::RecomputeMode::full, "block");
  at::Tensor x = torch::ones({2, 4}, torch::requires_grad());
  e->drift = false;
  (e->forward(x).sum()).backward();
  at::Tensor x2 = torch::ones({2, 4}, torch::requires_grad());
  e->set_recompute_mode(shardplan::RecomputeMode::none);
  const at::Tensor w_grad = e->fc->weight.grad().clone();
  e->fc->weight.grad().zero_();
  (e->forward(x2).sum()).backward();
  EXPECT_TRUE(x.grad().equal(x2.grad()));
  EXPECT_TRUE(e->fc->weight.grad().equal(w_grad));
}

}  // namespace test_recompute
