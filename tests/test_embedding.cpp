// shardplan::nn::Embedding as a drop-in for torch::nn::Embedding, and the
// embedding plugin against the same model run unsharded: vocab-parallel
// (even, uneven and with an empty rank) and embedding-dim-parallel (gathered,
// or sharded into a row-parallel Linear), at world sizes 1, 2 and 4, in
// float64 and float32, through five optimizer steps.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include "shardplan/nn/embedding.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"
#include "parity.h"

namespace test_embedding {

namespace {

using shardplan::nn::Embedding;
using torch::nn::EmbeddingOptions;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "shardplan_" + name + "_" + std::to_string(::getpid());
}

// ------------------------------------------------------------ drop-in

std::vector<EmbeddingOptions> option_sets() {
  return {
      EmbeddingOptions(11, 5),
      EmbeddingOptions(11, 5).padding_idx(3),
      EmbeddingOptions(11, 5).padding_idx(0),
      EmbeddingOptions(11, 5).padding_idx(-2),
      EmbeddingOptions(11, 5).padding_idx(1).max_norm(1.0).norm_type(1.5),
      EmbeddingOptions(11, 5).scale_grad_by_freq(true),
      EmbeddingOptions(11, 5).sparse(true),
  };
}

TEST(Embedding, InitialisationForwardAndBackwardAreBitIdenticalToTorch) {
  for (const auto& o : option_sets()) {
    torch::manual_seed(7);
    torch::nn::Embedding ref(o);
    torch::manual_seed(7);
    Embedding ours(o);
    ASSERT_TRUE(torch::equal(ref->weight, ours->weight));
    EXPECT_EQ(ref->options.padding_idx(), ours->options.padding_idx());
    EXPECT_EQ(ref->named_parameters().keys(), ours->named_parameters().keys());
    auto ids = torch::tensor({{1, 3, 9, 1}, {0, 9, 10, 3}}, torch::kLong);
    auto a = ref->forward(ids), b = ours->forward(ids);
    EXPECT_TRUE(torch::equal(a, b));
    EXPECT_TRUE(torch::equal(ref->weight, ours->weight));  // max_norm renormalises in place
    auto probe = torch::randn(a.sizes());
    (a * probe).sum().backward();
    (b * probe).sum().backward();
    auto ga = ref->weight.grad(), gb = ours->weight.grad();
    if (o.sparse()) {
      ASSERT_TRUE(gb.is_sparse());
      ga = ga.to_dense();
      gb = gb.to_dense();
    }
    EXPECT_TRUE(torch::equal(ga, gb));
  }
}

TEST(Embedding, VanillaCheckpointLoadsIntoItAndBack) {
  torch::manual_seed(1);
  torch::nn::Sequential vanilla(torch::nn::Embedding(EmbeddingOptions(9, 4).padding_idx(2)), torch::nn::Linear(4, 2));
  torch::manual_seed(99);  // different init, so loading must overwrite it
  torch::nn::Sequential ours(Embedding(EmbeddingOptions(9, 4).padding_idx(2)), shardplan::nn::Linear(4, 2));
  const std::string p1 = temp_path("vanilla_emb.pt"), p2 = temp_path("ours_emb.pt");
  torch::save(vanilla, p1);
  torch::load(ours, p1);
  auto ids = torch::tensor({{0, 2, 8}, {5, 5, 1}}, torch::kLong);
  EXPECT_TRUE(torch::equal(vanilla->forward(ids), ours->forward(ids)));

  torch::manual_seed(5);
  torch::nn::Sequential back(torch::nn::Embedding(EmbeddingOptions(9, 4).padding_idx(2)), torch::nn::Linear(4, 2));
  torch::save(ours, p2);
  torch::load(back, p2);
  EXPECT_TRUE(torch::equal(vanilla->forward(ids), back->forward(ids)));
  std::remove(p1.c_str());
  std::remove(p2.c_str());
}

TEST(Embedding, PrettyPrintNamesTheType) {
  std::ostringstream os;
  Embedding e(EmbeddingOptions(10, 3).padding_idx(-1));
  e->pretty_print(os);
  EXPECT_EQ(os.str(), "shardplan::nn::Embedding(num_embeddings=10, embedding_dim=3, padding_idx=9)");
}

TEST(Embedding, ShardRangeIsCeilDivisionWithSmallerLastParts) {
  auto sizes = [](int64_t n, int64_t parts) {
    std::vector<int64_t> out;
    int64_t next = 0;
    for (int64_t i = 0; i < parts; ++i) {
      auto r = shardplan::shard_range(n, parts, i);
      EXPECT_EQ(r.first, next);
      next = r.second;
      out.push_back(r.second - r.first);
    }
    EXPECT_EQ(next, n);
    return out;
  };
  EXPECT_EQ(sizes(10, 4), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(sizes(5, 4), (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(sizes(12, 4), (std::vector<int64_t>{3, 3, 3, 3}));
  EXPECT_EQ(sizes(1, 2), (std::vector<int64_t>{1, 0}));
  EXPECT_THROW(shardplan::shard_range(4, 2, 2), shardplan::Error);
}

// ------------------------------------------------------------ parity

constexpr int64_t kDim = 8;

struct NetImpl : torch::nn::Cloneable<NetImpl> {
  NetImpl(EmbeddingOptions o, bool head) : o(std::move(o)), head(head) { reset(); }
  void reset() override {
    emb = register_module("emb", Embedding(o));
    if (head) fc = register_module("fc", shardplan::nn::Linear(kDim, 3));
  }
  torch::Tensor forward(const torch::Tensor& ids) {
    auto y = emb->forward(ids);
    return head ? fc->forward(torch::tanh(y)) : y;
  }
  EmbeddingOptions o;
  bool head;
  Embedding emb{nullptr};
  shardplan::nn::Linear fc{nullptr};
};

enum class Split { Vocab, Dim };

struct Case {
  std::string name;
  std::string rules;
  Split split;
  bool head = false;      // a row-parallel Linear after a sharded output
  int64_t vocab = 12;
  c10::optional<int64_t> padding_idx;
  bool scale_grad_by_freq = false;
  c10::optional<double> max_norm;
  int world = 2;
  torch::Dtype dtype = torch::kDouble;
  bool adam = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name << " world " << c.world; }

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return c.name + "_ws" + std::to_string(c.world) + (c.dtype == torch::kDouble ? "_f64" : "_f32") +
         (c.adam ? "_adam" : "_sgd");
}

const char* kVocabRule = "  - {match: 'emb\\.weight', layout: [model, null]}\n";
const char* kDimRule = "  - {match: 'emb\\.weight', layout: [null, model]}\n";
const char* kDimShardedRules =
    "  - {match: 'emb\\.weight', layout: [null, model], output: sharded}\n"
    "  - {match: 'fc\\.weight', layout: [null, model], input: sharded}\n";

std::vector<Case> all_cases() {
  std::vector<Case> base;
  {
    Case c{"vocab_even_pad", kVocabRule, Split::Vocab};
    c.vocab = 12;
    c.padding_idx = 3;
    base.push_back(c);
  }
  {
    // 10 over 4 ranks: 3, 3, 3, 1 rows; the padding row (-1, so 9) is the
    // last rank's only row.
    Case c{"vocab_uneven_pad_last", kVocabRule, Split::Vocab};
    c.vocab = 10;
    c.padding_idx = -1;
    base.push_back(c);
  }
  {
    Case c{"dim_gathered_pad", kDimRule, Split::Dim};
    c.vocab = 10;
    c.padding_idx = 0;
    base.push_back(c);
  }
  {
    Case c{"dim_sharded_into_row_linear", kDimShardedRules, Split::Dim};
    c.head = true;
    c.vocab = 10;
    c.padding_idx = 4;
    base.push_back(c);
  }
  std::vector<Case> out;
  for (const auto& b : base)
    for (int world : {1, 2, 4})
      for (auto dtype : {torch::kDouble, torch::kFloat}) {
        Case c = b;
        c.world = world;
        c.dtype = dtype;
        out.push_back(c);
      }
  {
    // 5 over 4 ranks: 2, 2, 1, 0 rows: the last rank owns nothing.
    Case c{"vocab_empty_rank", kVocabRule, Split::Vocab};
    c.vocab = 5;
    c.padding_idx = 4;
    c.world = 4;
    out.push_back(c);
    c.dtype = torch::kFloat;
    out.push_back(c);
  }
  for (int world : {2, 4}) {
    Case c{"vocab_uneven_scale_grad_by_freq", kVocabRule, Split::Vocab};
    c.vocab = 10;
    c.padding_idx = 2;
    c.scale_grad_by_freq = true;
    c.world = world;
    out.push_back(c);
    Case d{"dim_scale_grad_by_freq", kDimRule, Split::Dim};
    d.vocab = 10;
    d.scale_grad_by_freq = true;
    d.world = world;
    out.push_back(d);
    Case m{"vocab_uneven_max_norm", kVocabRule, Split::Vocab};
    m.vocab = 10;
    m.padding_idx = 5;
    m.max_norm = 1.5;
    m.world = world;
    out.push_back(m);
    m.dtype = torch::kFloat;
    out.push_back(m);
  }
  {
    Case c{"vocab_uneven_pad_last", kVocabRule, Split::Vocab};
    c.vocab = 10;
    c.padding_idx = 9;
    c.world = 4;
    c.adam = true;
    out.push_back(c);
  }
  return out;
}

class EmbeddingParity : public ::testing::TestWithParam<Case> {};

TEST_P(EmbeddingParity, MatchesUnshardedModel) {
  const Case& c = GetParam();
  torch::manual_seed(1234);
  auto o = EmbeddingOptions(c.vocab, kDim).scale_grad_by_freq(c.scale_grad_by_freq);
  if (c.padding_idx) o.padding_idx(*c.padding_idx);
  if (c.max_norm) o.max_norm(*c.max_norm);
  auto reference = std::make_shared<NetImpl>(o, c.head);
  reference->to(c.dtype);
  parity::Setup s;
  s.world = c.world;
  s.dtype = c.dtype;
  s.adam = c.adam;
  for (int step = 0; step < s.steps; ++step) {
    // Every id (so every rank's range and the padding row) at least once,
    // then random repeats (which scale_grad_by_freq counts).
    auto ids = torch::cat({torch::arange(c.vocab), torch::randint(c.vocab, {24 - c.vocab}, torch::kLong)});
    s.inputs.push_back({ids.index_select(0, torch::randperm(24)).view({4, 6})});
  }
  s.forward = [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
    return dynamic_cast<NetImpl&>(m).forward(in[0]);
  };
  const Split split = c.split;
  s.local = [split](const std::string& name, const torch::Tensor& full, int rank, int world) {
    if (name == "emb.weight" && split == Split::Vocab) {
      auto r = shardplan::shard_range(full.size(0), world, rank);
      return full.narrow(0, r.first, r.second - r.first);
    }
    if (name == "emb.weight" || name == "fc.weight") return shardplan::shard_of(full, 1, world, rank);
    return full;
  };
  auto plan = shardplan::parse_plan("mesh: {model: auto}\nrules:\n" + c.rules, c.name + ".yaml");
  for (const auto& f : parity::compare(reference, plan, s)) ADD_FAILURE() << f;
}

INSTANTIATE_TEST_SUITE_P(Embedding, EmbeddingParity, ::testing::ValuesIn(all_cases()), case_name);

// ------------------------------------------------------------ plans

std::string check_error(torch::nn::Module& m, const std::string& rules, int world = 2) {
  try {
    shardplan::check_plan(m, shardplan::parse_plan("mesh: {model: auto}\nrules:\n" + rules, "bad.yaml"), world);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::shared_ptr<NetImpl> net(EmbeddingOptions o) { return std::make_shared<NetImpl>(std::move(o), false); }

TEST(EmbeddingPlan, VanillaTorchEmbeddingIsRejectedNamingTheTypeToUse) {
  torch::nn::Sequential m(torch::nn::Embedding(10, 4));
  auto msg = check_error(*m, "  - {match: '0\\.weight', layout: [model, null]}\n");
  EXPECT_NE(msg.find("parameter '0.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("build the model with shardplan::nn::Embedding"), std::string::npos) << msg;
}

TEST(EmbeddingPlan, MaxNormIsRejectedForDimParallel) {
  auto m = net(EmbeddingOptions(10, 8).max_norm(1.0));
  auto msg = check_error(*m, kDimRule);
  EXPECT_NE(msg.find("bad.yaml:3:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("parameter 'emb.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("max_norm renormalises whole rows"), std::string::npos) << msg;
  EXPECT_EQ(check_error(*m, kVocabRule), "");
}

TEST(EmbeddingPlan, SparseIsRejectedForShardedLayouts) {
  auto m = net(EmbeddingOptions(10, 8).sparse(true));
  for (const char* rule : {kVocabRule, kDimRule}) {
    auto msg = check_error(*m, rule);
    EXPECT_NE(msg.find("bad.yaml:3:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("parameter 'emb.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("sparse gradients are not supported"), std::string::npos) << msg;
  }
  EXPECT_EQ(check_error(*m, "  - {match: 'emb\\.weight', layout: [null, null]}\n"), "");
}

TEST(EmbeddingPlan, NonDivisibleEmbeddingDimAndMisplacedOptionsAreRejected) {
  auto m = net(EmbeddingOptions(10, 6));
  auto dim = check_error(*m, kDimRule, 4);
  EXPECT_NE(dim.find("bad.yaml:3:"), std::string::npos) << dim;
  EXPECT_NE(dim.find("'emb.weight'"), std::string::npos) << dim;
  EXPECT_NE(dim.find("embedding_dim 6 is not divisible by mesh axis 'model' of size 4"), std::string::npos) << dim;
  auto out = check_error(*m, "  - {match: 'emb\\.weight', layout: [model, null], output: sharded}\n");
  EXPECT_NE(out.find("option 'output'"), std::string::npos) << out;
  auto in = check_error(*m, "  - {match: 'emb\\.weight', layout: [null, model], input: sharded}\n");
  EXPECT_NE(in.find("option 'input'"), std::string::npos) << in;
  auto both = check_error(*m, "  - {match: 'emb\\.weight', layout: [model, model]}\n");
  EXPECT_FALSE(both.empty());
}

TEST(EmbeddingPlan, ReportGivesEachRanksUnevenVocabShape) {
  auto m = net(EmbeddingOptions(10, 8));
  auto plan = shardplan::parse_plan(std::string("mesh: {model: auto}\nrules:\n") + kVocabRule);
  const std::vector<int64_t> rows = {3, 3, 3, 1};
  for (int rank = 0; rank < 4; ++rank) {
    auto report = shardplan::check_plan(*m, plan, 4, rank);
    ASSERT_EQ(report.rows.size(), 1u);
    EXPECT_EQ(report.rows[0].plugin, "embedding");
    EXPECT_EQ(report.rows[0].local_shape, (std::vector<int64_t>{rows[rank], 8})) << "rank " << rank;
    EXPECT_NE(report.rows[0].note.find("vocab-parallel"), std::string::npos) << report.rows[0].note;
  }
  auto dim_plan = shardplan::parse_plan(std::string("mesh: {model: auto}\nrules:\n") + kDimRule);
  auto dim = shardplan::check_plan(*m, dim_plan, 4);
  EXPECT_EQ(dim.rows[0].local_shape, (std::vector<int64_t>{10, 2}));
}

}  // namespace

}  // namespace test_embedding
