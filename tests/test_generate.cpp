// Generation with the example GPT (examples/models/generate.h) under
// plans/gpt.yaml at world 2 and 4 (ranks as threads, local backend) against
// the same model unsharded: greedy and sampled tokens identical on every rank
// and to the unsharded run, incremental decoding through the key/value cache
// against recomputing the whole sequence, per-rank cache bytes 1/N of the
// unsharded cache, and the errors for bad prompts.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "models/generate.h"
#include "models/gpt.h"
#include "models/model.h"
#include "shardplan/error.h"
#include "shardplan/nn/kv_cache.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/random.h"
#include "shardplan/world.h"

namespace test_generate {

namespace {

namespace ex = shardplan::examples;

// Every dim divisible by 4 ranks; context long enough for a prompt and a
// dozen new tokens.
const ex::Overrides kGpt = {{"vocab", "32"}, {"context", "16"}, {"embed", "16"},
                            {"heads", "4"},  {"layers", "2"},   {"mlp", "24"}};
const int64_t kBatch = 2, kPrompt = 4, kNew = 12;

std::shared_ptr<ex::GPTImpl> reference(torch::Dtype dtype) {
  torch::manual_seed(3);
  auto m = std::dynamic_pointer_cast<ex::GPTImpl>(ex::make_model("gpt", kGpt).module);
  m->to(dtype);
  return m;
}

torch::Tensor prompt() {
  torch::manual_seed(7);
  return torch::randint(32, {kBatch, kPrompt}, torch::kLong);
}

shardplan::Plan gpt_plan() { return shardplan::load_plan(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/gpt.yaml"); }

ex::GenerateOptions options(double temperature, int64_t top_k) {
  ex::GenerateOptions o;
  o.new_tokens = kNew;
  o.temperature = temperature;
  o.top_k = top_k;
  return o;
}

ex::Generation unsharded(const ex::GenerateOptions& o, torch::Dtype dtype, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return ex::generate(*reference(dtype), prompt(), o, gen);
}

// Each rank's generation at `world` ranks, sampling from the RNG tracker's
// replicated stream seeded with `seed`.
std::vector<ex::Generation> sharded(int world, const ex::GenerateOptions& o, torch::Dtype dtype, uint64_t seed) {
  auto ref = reference(dtype);
  std::vector<std::shared_ptr<ex::GPTImpl>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(std::dynamic_pointer_cast<ex::GPTImpl>(ref->clone()));
  const torch::Tensor p = prompt();
  std::vector<ex::Generation> out(world);
  std::mutex mu;
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    const auto report = shardplan::parallelize(model, gpt_plan(), w);
    auto tracker = shardplan::manual_seed(w, seed, report.mesh);
    ex::Generation g = ex::generate(model, p, o, tracker->replicated(), &w.comm());
    std::lock_guard<std::mutex> lock(mu);
    out[w.rank()] = g;
  });
  return out;
}

void expect_same_tokens(const ex::GenerateOptions& o, torch::Dtype dtype, uint64_t seed) {
  const ex::Generation ref = unsharded(o, dtype, seed);
  ASSERT_EQ(ref.tokens.sizes().vec(), (std::vector<int64_t>{kBatch, kNew}));
  for (int world : {2, 4}) {
    const auto got = sharded(world, o, dtype, seed);
    for (int r = 0; r < world; ++r)
      EXPECT_TRUE(got[r].tokens.equal(ref.tokens))
          << "world " << world << " rank " << r << " " << dtype << ": " << got[r].tokens << " vs unsharded "
          << ref.tokens;
  }
}

TEST(GptGenerate, GreedyAtWorld2And4EqualsUnshardedTokenForToken) {
  expect_same_tokens(options(0, 0), torch::kDouble, 1);
  expect_same_tokens(options(0, 0), torch::kFloat, 1);
  // top-k 1 is greedy whatever the temperature.
  const ex::Generation greedy = unsharded(options(0, 0), torch::kDouble, 1);
  EXPECT_TRUE(unsharded(options(5.0, 1), torch::kDouble, 99).tokens.equal(greedy.tokens));
}

TEST(GptGenerate, SamplingIsTheSameOnEveryRankAndUnshardedForOneSeed) {
  expect_same_tokens(options(0.9, 8), torch::kDouble, 21);
  expect_same_tokens(options(1.0, 0), torch::kFloat, 22);
  // The draws do depend on the seed and differ from greedy, or the checks
  // above could not fail.
  const auto a = unsharded(options(1.5, 0), torch::kDouble, 21), b = unsharded(options(1.5, 0), torch::kDouble, 23);
  EXPECT_FALSE(a.tokens.equal(b.tokens));
  EXPECT_FALSE(a.tokens.equal(unsharded(options(0, 0), torch::kDouble, 21).tokens));
}

// The agreement check can fail: ranks sampling from streams seeded apart
// (no replicated stream) are caught, on every rank, after the last step.
TEST(GptGenerate, RanksSamplingDifferentlyAreCaught) {
  auto ref = reference(torch::kDouble);
  std::vector<std::shared_ptr<ex::GPTImpl>> replicas;
  for (int r = 0; r < 2; ++r) replicas.push_back(std::dynamic_pointer_cast<ex::GPTImpl>(ref->clone()));
  const torch::Tensor p = prompt();
  std::vector<std::string> errors(2);
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    shardplan::parallelize(model, gpt_plan(), w);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + w.rank());
    try {
      ex::generate(model, p, options(2.0, 0), gen, &w.comm());
    } catch (const shardplan::Error& e) {
      errors[w.rank()] = e.what();
    }
  });
  for (const auto& e : errors)
    EXPECT_EQ(e, "generate: the ranks of 'world' generated different tokens (their logits or sampling streams differ)");
}

TEST(GptGenerate, TopKDrawsOnlyAmongTheKLikeliest) {
  torch::manual_seed(0);
  const torch::Tensor logits = torch::randn({4, 32}, torch::kDouble);
  const torch::Tensor top = std::get<1>(logits.topk(3, -1));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  std::map<int64_t, int> seen;
  for (int i = 0; i < 200; ++i) {
    const torch::Tensor t = ex::next_token(logits, options(2.0, 3), gen);
    for (int64_t b = 0; b < 4; ++b) {
      EXPECT_TRUE((top[b] == t[b]).any().item<bool>()) << "row " << b << " drew " << t[b].item<int64_t>();
      if (b == 0) seen[t[b].item<int64_t>()]++;
    }
  }
  EXPECT_EQ(seen.size(), 3u) << "a high temperature should reach each of the 3";
}

// The logits of every position, fed through the cache as a prompt of 5 and
// then one token at a time, against one forward over the whole sequence.
void expect_incremental_equals_full(int world) {
  auto ref = reference(torch::kDouble);
  torch::manual_seed(9);
  const torch::Tensor tokens = torch::randint(32, {kBatch, 16}, torch::kLong);
  std::vector<std::shared_ptr<ex::GPTImpl>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(std::dynamic_pointer_cast<ex::GPTImpl>(ref->clone()));
  std::mutex mu;
  std::vector<std::string> failures;
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    if (world > 1) shardplan::parallelize(model, gpt_plan(), w);
    torch::NoGradGuard no_grad;
    model.eval();
    const torch::Tensor full = model.full_logits(model.forward(tokens));  // [T, B, V]
    auto caches = model.make_caches();
    std::vector<torch::Tensor> steps{model.forward_cached(tokens.narrow(1, 0, 5), caches)};
    for (int64_t t = 5; t < tokens.size(1); ++t) steps.push_back(model.forward_cached(tokens.narrow(1, t, 1), caches));
    const torch::Tensor incremental = torch::cat(steps);
    std::lock_guard<std::mutex> lock(mu);
    if (full.sizes() != incremental.sizes() || full.size(-1) != 32)
      failures.push_back("shapes differ");
    else if (!torch::allclose(incremental, full, 1e-10, 1e-10))
      failures.push_back("rank " + std::to_string(w.rank()) + ": max difference " +
                         std::to_string((incremental - full).abs().max().item<double>()));
    for (const auto& c : caches)
      if (c.length() != 16) failures.push_back("a cache holds " + std::to_string(c.length()) + " positions, not 16");
  });
  EXPECT_TRUE(failures.empty()) << "world " << world << ": " << failures[0];
}

TEST(GptGenerate, IncrementalDecodingEqualsRecomputingTheFullSequence) {
  for (int world : {1, 2, 4}) expect_incremental_equals_full(world);
}

TEST(GptGenerate, CacheBytesPerRankAreTheUnshardedOverN) {
  for (auto dtype : {torch::kDouble, torch::kFloat}) {
    const int64_t esize = dtype == torch::kDouble ? 8 : 4;
    // keys and values, per layer, of every head over the whole context
    const int64_t whole = 2 * 2 * kBatch * 16 * 16 * esize;
    EXPECT_EQ(unsharded(options(0, 0), dtype, 1).cache_bytes, whole);
    for (int world : {2, 4})
      for (const auto& g : sharded(world, options(0, 0), dtype, 1))
        EXPECT_EQ(g.cache_bytes * world, whole) << "world " << world;
  }
}

// Stop ids (a tokenizer's EOS): each row ends at its first one and keeps it
// for the steps after, and generation ends once every row has one: greedy
// and sampled, unsharded and at 2 and 4 ranks alike. The rows' stops are
// read off a run without them (the draws before a stop are the same).
void expect_stops(double temperature, int64_t top_k, uint64_t seed) {
  const ex::Generation free = unsharded(options(temperature, top_k), torch::kDouble, seed);
  const auto t = free.tokens.accessor<int64_t, 2>();
  // Row 0's 3rd token and row 1's 4th: each row stops there or earlier.
  ex::GenerateOptions o = options(temperature, top_k);
  o.stop_ids = {t[0][2], t[1][3]};
  std::vector<int64_t> stops(kBatch);  // each row's first stop id
  torch::Tensor want = free.tokens.clone();
  int64_t length = 0;
  for (int64_t r = 0; r < kBatch; ++r) {
    int64_t& k = stops[r];
    while (t[r][k] != o.stop_ids[0] && t[r][k] != o.stop_ids[1]) ++k;
    want[r].narrow(0, k, kNew - k).fill_(t[r][k]);
    length = std::max(length, k + 1);
  }
  want = want.narrow(1, 0, length);  // at most 4 of the 12
  const ex::Generation got = unsharded(o, torch::kDouble, seed);
  EXPECT_TRUE(got.tokens.equal(want)) << got.tokens << " vs " << want;
  for (int world : {2, 4})
    for (const auto& g : sharded(world, o, torch::kDouble, seed))
      EXPECT_TRUE(g.tokens.equal(want)) << "world " << world << ": " << g.tokens << " vs " << want;
  for (int64_t r = 0; r < kBatch; ++r) {
    bool stopped = false;
    EXPECT_EQ(ex::sample_length(got.tokens[r], o.stop_ids, &stopped), stops[r]);
    EXPECT_TRUE(stopped);
  }
}

TEST(GptGenerate, StopIdsEndEachRowAndTheGenerationOnEveryRank) {
  expect_stops(0, 0, 1);
  expect_stops(0.9, 8, 21);
}

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const shardplan::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(GptGenerate, RejectsEmptyAndTooLongPromptsClearly) {
  auto model = reference(torch::kDouble);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  EXPECT_EQ(error_of([&] { ex::generate(*model, torch::empty({1, 0}, torch::kLong), options(0, 0), gen); }),
            "generate: the prompt is empty; give at least one token (--prompt TEXT)");
  EXPECT_EQ(error_of([&] { ex::generate(*model, torch::zeros({1, 17}, torch::kLong), options(0, 0), gen); }),
            "generate: the prompt has 17 tokens, longer than the context of 16");
  EXPECT_EQ(error_of([&] { ex::generate(*model, torch::zeros({1, 10}, torch::kLong), options(0, 0), gen); }),
            "generate: the prompt's 10 tokens + 12 new tokens exceed the context of 16 (the cache does not slide: "
            "generate at most 6, or train with a longer context)");
  EXPECT_EQ(error_of([&] { ex::generate(*model, torch::full({1, 3}, 40, torch::kLong), options(0, 0), gen); }),
            "generate: prompt token ids must be in [0, 32)");
  EXPECT_EQ(error_of([&] { ex::generate(*model, torch::zeros({1, 3}, torch::kLong), options(-1, 0), gen); }),
            "generate: the temperature must be a finite number >= 0 (0: greedy)");
  // The model and the cache guard the context themselves.
  auto caches = model->make_caches();
  torch::NoGradGuard no_grad;
  model->forward_cached(torch::zeros({1, 16}, torch::kLong), caches);
  EXPECT_EQ(error_of([&] { model->forward_cached(torch::zeros({1, 1}, torch::kLong), caches); }),
            "gpt: 16 cached + 1 new positions exceed the context of 16");
  shardplan::nn::KVCache cache(2);
  cache.append(torch::zeros({4, 2, 3}), torch::zeros({4, 2, 3}));
  EXPECT_EQ(error_of([&] { cache.append(torch::zeros({4, 1, 3}), torch::zeros({4, 1, 3})); }),
            "KVCache: 2 cached + 1 new positions exceed its capacity of 2 (the context)");
}

}  // namespace

}  // namespace test_generate
