// Tied weights (token embedding <-> LM head): a tiny LM whose head reuses
// the embedding's weight, sharded vocab-parallel on both (logits kept split
// into the vocab-parallel cross-entropy, or gathered) or embedding-dim
// parallel on both, against the same model unsharded; plans that would
// shard the one tensor two ways are rejected naming both paths; the report
// counts the tensor once.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>
#include <string>
#include <vector>

#include "shardplan/error.h"
#include "shardplan/nn/cross_entropy.h"
#include "shardplan/nn/embedding.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/shard.h"
#include "shardplan/tied.h"
#include "shardplan/world.h"
#include "parity.h"

namespace test_tied {

namespace {

constexpr int64_t kVocab = 16, kDim = 8;

struct TinyLMImpl : torch::nn::Cloneable<TinyLMImpl> {
  TinyLMImpl() { reset(); }
  void reset() override {
    emb = register_module("emb", shardplan::nn::Embedding(kVocab, kDim));
    head = register_module("head", shardplan::nn::Linear(torch::nn::LinearOptions(kDim, kVocab).bias(false)));
    loss = register_module("loss", shardplan::nn::CrossEntropyLoss());
    tie();
  }
  void tie() { head->weight = shardplan::tie_parameter(*head, "weight", emb->weight); }
  // Module::clone copies each submodule on its own, which unties them.
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& device = c10::nullopt) const override {
    auto copy = torch::nn::Cloneable<TinyLMImpl>::clone(device);
    std::dynamic_pointer_cast<TinyLMImpl>(copy)->tie();
    return copy;
  }
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& targets) {
    auto h = torch::tanh(emb(ids));  // [B, T, D]
    auto logits = head(h);           // [B, T, V], maybe split over V
    return loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  }
  shardplan::nn::Embedding emb{nullptr};
  shardplan::nn::Linear head{nullptr};
  shardplan::nn::CrossEntropyLoss loss{nullptr};
};
TORCH_MODULE(TinyLM);

struct Case {
  std::string name, rules;
  int64_t split_dim;  // of the tied weight
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"vocab_parallel_sharded_logits",
       "  - match: 'emb\\.weight'\n    layout: [model, null]\n"
       "  - match: 'head\\.weight'\n    layout: [model, null]\n    output: sharded\n"
       "  - match: 'loss'\n    layout: [null, model]\n",
       0},
      {"vocab_parallel_gathered_logits",
       "  - match: 'emb\\.weight'\n    layout: [model, null]\n"
       "  - match: 'head\\.weight'\n    layout: [model, null]\n",
       0},
      {"embedding_dim_parallel",
       "  - match: 'emb\\.weight'\n    layout: [null, model]\n    output: sharded\n"
       "  - match: 'head\\.weight'\n    layout: [null, model]\n    input: sharded\n",
       1},
  };
  return c;
}

parity::Setup setup_for(const Case& c, int world, torch::Dtype dtype) {
  parity::Setup s;
  s.world = world;
  s.dtype = dtype;
  torch::manual_seed(123);
  for (int step = 0; step < s.steps; ++step)
    s.inputs.push_back({torch::randint(kVocab, {3, 5}, torch::kLong), torch::randint(kVocab, {3, 5}, torch::kLong)});
  s.forward = [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
    return dynamic_cast<TinyLMImpl&>(m).forward(in[0], in[1]);
  };
  const int64_t dim = c.split_dim;
  s.local = [dim](const std::string& name, const torch::Tensor& full, int rank, int n) {
    return shardplan::shard_of(full, dim, n, rank);
  };
  return s;
}

class TiedParity : public ::testing::TestWithParam<std::tuple<size_t, int, torch::Dtype>> {};

TEST_P(TiedParity, MatchesUnsharded) {
  const Case& c = cases()[std::get<0>(GetParam())];
  const int world = std::get<1>(GetParam());
  const torch::Dtype dtype = std::get<2>(GetParam());
  torch::manual_seed(7);
  TinyLM ref;
  ref->to(dtype);
  ASSERT_TRUE(ref->head->weight.is_same(ref->emb->weight));
  auto plan = shardplan::parse_plan("mesh: {model: auto}\nrules:\n" + c.rules, c.name + ".yaml");
  auto failures = parity::compare(ref.ptr(), plan, setup_for(c, world, dtype));
  for (const auto& f : failures) ADD_FAILURE() << c.name << ": " << f;
}

INSTANTIATE_TEST_SUITE_P(Plans, TiedParity,
                         ::testing::Combine(::testing::Values(0u, 1u, 2u), ::testing::Values(1, 2, 4),
                                            ::testing::Values(torch::kDouble, torch::kFloat)));

TEST(Tied, StaysOneTensorAfterParallelize) {
  torch::manual_seed(3);
  std::vector<TinyLM> models;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(3);
    models.emplace_back();
  }
  const auto full = models[0]->emb->weight.detach().clone();
  auto plan = shardplan::parse_plan("mesh: {model: auto}\nrules:\n" + cases()[0].rules);
  std::mutex mu;
  std::vector<shardplan::ParallelReport> reports(2);
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
    TinyLM& m = models[w.rank()];
    auto report = shardplan::parallelize(*m, plan, w);
    EXPECT_TRUE(m->head->weight.is_same(m->emb->weight));
    auto params = m->named_parameters();
    EXPECT_EQ(params["head.weight"].unsafeGetTensorImpl(), params["emb.weight"].unsafeGetTensorImpl());
    EXPECT_TRUE(torch::equal(m->emb->weight, full.chunk(2, 0)[w.rank()]));
    EXPECT_EQ(shardplan::unique_parameters(*m).size(), 1u);
    std::lock_guard<std::mutex> lock(mu);
    reports[w.rank()] = report;
  });
  for (const auto& r : reports) {
    ASSERT_EQ(r.rows.size(), 3u);  // emb.weight, head.weight, loss
    EXPECT_EQ(r.rows[0].tied_to, "");
    EXPECT_EQ(r.rows[1].path, "head.weight");
    EXPECT_EQ(r.rows[1].tied_to, "emb.weight");
    EXPECT_NE(r.rows[1].note.find("tied to emb.weight"), std::string::npos) << r.rows[1].note;
    EXPECT_NE(r.table().find("tied to emb.weight"), std::string::npos);
    EXPECT_EQ(r.global_bytes(), kVocab * kDim * 4);
    EXPECT_EQ(r.local_bytes(), kVocab * kDim * 4 / 2);
  }
}

// With unique_parameters the tied tensor takes one optimizer step per step
// (Python's semantics); sharded it still matches the unsharded model.
TEST(Tied, UniqueParametersForTheOptimizer) {
  torch::manual_seed(5);
  TinyLM ref;
  ref->to(torch::kDouble);
  EXPECT_EQ(ref->parameters().size(), 2u);
  EXPECT_EQ(shardplan::unique_parameters(*ref).size(), 1u);
  EXPECT_EQ(shardplan::tied_parameters(*ref), (std::vector<std::vector<std::string>>{{"emb.weight", "head.weight"}}));
  std::vector<TinyLM> replicas;
  for (int r = 0; r < 2; ++r) replicas.emplace_back(std::dynamic_pointer_cast<TinyLMImpl>(ref->clone()));
  EXPECT_TRUE(replicas[0]->head->weight.is_same(replicas[0]->emb->weight));
  EXPECT_FALSE(replicas[0]->emb->weight.is_same(ref->emb->weight));
  torch::manual_seed(9);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int i = 0; i < 4; ++i)
    batches.emplace_back(torch::randint(kVocab, {2, 7}, torch::kLong), torch::randint(kVocab, {2, 7}, torch::kLong));
  auto train = [&](TinyLMImpl& m) {
    torch::optim::SGD opt(shardplan::unique_parameters(m), torch::optim::SGDOptions(0.5).momentum(0.9));
    for (const auto& b : batches) {
      opt.zero_grad();
      m.forward(b.first, b.second).backward();
      opt.step();
    }
  };
  const auto before = ref->emb->weight.detach().clone();
  train(*ref);
  auto plan = shardplan::parse_plan("mesh: {model: auto}\nrules:\n" + cases()[0].rules);
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
    TinyLM& m = replicas[w.rank()];
    shardplan::parallelize(*m, plan, w);
    train(*m);
    EXPECT_LT(parity::rel_err(m->emb->weight, ref->emb->weight.chunk(2, 0)[w.rank()]), 1e-12);
  });
  // And it differs from stepping the tensor twice per step.
  torch::manual_seed(5);
  TinyLM twice;
  twice->to(torch::kDouble);
  ASSERT_TRUE(torch::equal(twice->emb->weight, before));
  torch::optim::SGD opt(twice->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
  for (const auto& b : batches) {
    opt.zero_grad();
    twice->forward(b.first, b.second).backward();
    opt.step();
  }
  EXPECT_GT((twice->emb->weight - ref->emb->weight).abs().max().item<double>(), 1e-6);
}

// ------------------------------------------------------------ rejections

std::string plan_error(const std::string& rules, int world = 2, const std::string& mesh = "{model: auto}") {
  TinyLM m;
  try {
    shardplan::check_plan(*m, shardplan::parse_plan("mesh: " + mesh + "\nrules:\n" + rules, "tied.yaml"), world);
  } catch (const shardplan::Error& e) {
    return e.what();
  }
  return "";
}

void expect_mentions(const std::string& msg, const std::vector<std::string>& parts) {
  ASSERT_FALSE(msg.empty()) << "no error";
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

TEST(Tied, RejectsOneShardedOneReplicated) {
  expect_mentions(plan_error("  - match: 'emb\\.weight'\n    layout: [model, null]\n"),
                  {"tied.yaml:3:", "tied parameters", "'emb.weight' (layout [model, null]", "rule at tied.yaml:3",
                   "'head.weight' (layout [null, null], unmatched", "untie"});
  expect_mentions(plan_error("  - match: 'head\\.weight'\n    layout: [model, null]\n    output: sharded\n"
                             "  - match: 'loss'\n    layout: [null, model]\n"),
                  {"'emb.weight' (layout [null, null], unmatched", "'head.weight' (layout [model, null]"});
}

TEST(Tied, RejectsDifferentLayouts) {
  expect_mentions(plan_error("  - match: 'emb\\.weight'\n    layout: [model, null]\n"
                             "  - match: 'head\\.weight'\n    layout: [null, model]\n"),
                  {"tied.yaml:5:", "'emb.weight' (layout [model, null]", "'head.weight' (layout [null, model]",
                   "local shape [8, 8]", "local shape [16, 4]"});
  // Different axes of a 2-D mesh.
  expect_mentions(plan_error("  - match: 'emb\\.weight'\n    layout: [model, null]\n"
                             "  - match: 'head\\.weight'\n    layout: [data, null]\n",
                             4, "{data: 2, model: 2}"),
                  {"'emb.weight' (layout [model, null]", "'head.weight' (layout [data, null]"});
  // Same layout, but the head reads its rows as blocks.
  expect_mentions(plan_error("  - match: 'emb\\.weight'\n    layout: [model, null]\n"
                             "  - match: 'head\\.weight'\n    layout: [model, null]\n    blocks: 2\n"),
                  {"'head.weight' (layout [model, null]", "blocks 2"});
}

TEST(Tied, ParallelizeRejectsToo) {
  auto plan = shardplan::parse_plan("mesh: {model: auto}\nrules:\n  - match: 'emb\\.weight'\n    layout: [model, null]\n",
                                    "tied.yaml");
  std::vector<TinyLM> models(2);
  try {
    shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) { shardplan::parallelize(*models[w.rank()], plan, w); });
    FAIL() << "no error";
  } catch (const shardplan::Error& e) {
    expect_mentions(e.what(), {"'emb.weight'", "'head.weight'"});
  }
  // Nothing was sliced.
  EXPECT_EQ(models[0]->emb->weight.size(0), kVocab);
}

TEST(Tied, TieParameter) {
  shardplan::nn::Linear a(3, 4), b(3, 4), c(4, 3);
  b->weight = shardplan::tie_parameter(*b, "weight", a->weight);
  EXPECT_TRUE(b->named_parameters()["weight"].is_same(a->weight));
  EXPECT_THROW(shardplan::tie_parameter(*c, "weight", a->weight), shardplan::Error);
  EXPECT_THROW(shardplan::tie_parameter(*c, "nope", a->weight), shardplan::Error);
}

}  // namespace

}  // namespace test_tied
