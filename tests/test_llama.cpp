// The example Llama (examples/models/llama.h) under plans/llama.yaml,
// plans/llama_sp.yaml and plans/llama_async.yaml (sequence parallelism with
// every Linear's gather or reduce-scatter a ring) against itself unsharded
// (tests/parity.h): forward, parameter gradients and parameters after three
// steps, at world 1, 2 and 4,
// float64 (1e-10) and float32, with kv_heads = heads, 2 (world 4 replicates
// each kv head on two ranks) and 1 (multi-query); Hugging Face's rotary
// convention and grouped-query head mapping; greedy generation through
// caches holding this rank's kv heads only; and the plan's errors.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "llama_fixture.h"
#include "models/generate.h"
#include "models/llama.h"
#include "models/model.h"
#include "parity.h"
#include "shardplan/checkpoint.h"
#include "shardplan/checkpoint_meta.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/random.h"
#include "shardplan/world.h"

namespace test_llama {

namespace {

namespace ex = shardplan::examples;

using llama_fixture::build;
using llama_fixture::config;
using llama_fixture::plan;
using llama_fixture::setup;

void expect_parity(const std::string& plan_name, int kv_heads, int world, torch::Dtype dtype) {
  auto failures = parity::compare(build(config(kv_heads), dtype), plan(plan_name), setup(world, dtype, kv_heads));
  EXPECT_TRUE(failures.empty()) << plan_name << " kv_heads " << kv_heads << " world " << world << ":\n"
                                << ::testing::PrintToString(failures);
}

TEST(Llama, ShardedEqualsUnshardedFloat64) {
  for (int kv : {4, 2, 1})
    for (int world : {1, 2, 4}) expect_parity("llama", kv, world, torch::kDouble);
}

TEST(Llama, ShardedEqualsUnshardedFloat32) {
  for (int kv : {4, 2, 1})
    for (int world : {2, 4}) expect_parity("llama", kv, world, torch::kFloat);
}

TEST(Llama, SequenceParallelEqualsUnsharded) {
  for (int kv : {2, 1})
    for (int world : {2, 4}) expect_parity("llama_sp", kv, world, torch::kDouble);
  expect_parity("llama_sp", 2, 4, torch::kFloat);
}

// The rings of async TP on every Linear, replicated kv heads (kv 2 and 1 at
// world 4) and multi-query included.
TEST(Llama, AsyncTensorParallelEqualsUnsharded) {
  for (int kv : {2, 1})
    for (int world : {2, 4}) expect_parity("llama_async", kv, world, torch::kDouble);
  expect_parity("llama_async", 2, 4, torch::kFloat);
}

// A kv head replicated on two ranks: each rank holds only the head its
// query heads read (reported as the rule's split, each piece on two ranks),
// the holders stay equal after a step (the gradient summed over them), and
// a checkpoint writes each head once, from its first holder, and reads back
// whole; loading it at 2 ranks, where each rank holds one kv head of its
// own, gives the same heads.
TEST(Llama, ReplicatedKvHeadsHoldOneHeadAndStayEqual) {
  namespace fs = std::filesystem;
  auto ref = build(config(2));
  const auto k_of = [](ex::LlamaImpl& m) -> torch::Tensor& {
    return m.model->layers[0]->as<ex::LlamaDecoderLayerImpl>()->self_attn->k_proj->weight;
  };
  const torch::Tensor k_ref = k_of(*ref).detach().clone();
  const fs::path dir = fs::temp_directory_path() / ("shardplan_llama_kv_" + std::to_string(::getpid()));
  std::vector<std::shared_ptr<ex::LlamaImpl>> models;
  for (int r = 0; r < 4; ++r) models.push_back(std::dynamic_pointer_cast<ex::LlamaImpl>(ref->clone()));
  std::mutex mu;
  std::vector<torch::Tensor> k(4);
  torch::Tensor k_collected;
  shardplan::run_ranks_in_threads(4, [&](shardplan::World& w) {
    auto& m = *models[w.rank()];
    auto report = shardplan::parallelize(m, plan("llama"), w);
    for (const auto& row : report.rows)
      if (row.path == "model.layers.0.self_attn.k_proj.weight") {
        EXPECT_EQ(row.layout, "[model, null]");
        EXPECT_EQ(row.local_shape, (std::vector<int64_t>{8, 32}));
        ASSERT_EQ(row.splits.size(), 1u);
        EXPECT_EQ(row.splits[0].shared, 2);
        EXPECT_EQ(row.splits[0].parts, 2);
        EXPECT_EQ(row.splits[0].index, w.rank() / 2);
        EXPECT_NE(row.note.find("heads replicated: 2 heads over 4 ranks"), std::string::npos) << row.note;
      }
    EXPECT_TRUE(torch::equal(k_of(m), k_ref.narrow(0, 8 * (w.rank() / 2), 8))) << "rank " << w.rank();
    torch::optim::SGD opt(m.parameters(), 0.5);
    torch::manual_seed(5);
    const auto t = torch::randint(32, {2, 9}, torch::kLong);
    m.loss({t.narrow(1, 0, 8), t.narrow(1, 1, 8)}).backward();
    opt.step();
    shardplan::save_checkpoint(dir.string(), m, report, w);
    const auto whole = shardplan::collect_state_dict(m, report, w);
    std::lock_guard<std::mutex> lock(mu);
    k[w.rank()] = k_of(m).detach().clone();
    for (const auto& kv : whole)
      if (kv.first == "model.layers.0.self_attn.k_proj.weight" && w.rank() == 0) k_collected = kv.second;
  });
  EXPECT_FALSE(torch::equal(k[0], k_ref.narrow(0, 0, 8)));
  EXPECT_TRUE(torch::equal(k[1], k[0]));
  EXPECT_TRUE(torch::equal(k[3], k[2]));
  const torch::Tensor k_whole = torch::cat({k[0], k[2]});
  EXPECT_TRUE(torch::equal(k_collected, k_whole));

  std::ifstream in(dir / "metadata.yaml");
  std::stringstream meta;
  meta << in.rdbuf();
  const auto parsed = shardplan::ckpt::parse_meta(meta.str(), "metadata.yaml");
  const auto* entry = parsed.find("model.layers.0.self_attn.k_proj.weight");
  ASSERT_NE(entry, nullptr);
  ASSERT_EQ(entry->pieces.size(), 2u);
  EXPECT_EQ(entry->pieces[0].rank, 0);
  EXPECT_EQ(entry->pieces[1].rank, 2);
  EXPECT_EQ(entry->pieces[1].split.at(0).shared, 2);
  for (const auto& kv : shardplan::read_checkpoint(dir.string()))
    if (kv.first == "model.layers.0.self_attn.k_proj.weight") EXPECT_TRUE(torch::equal(kv.second, k_whole));

  std::vector<torch::Tensor> k2(2);
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
    auto m = std::dynamic_pointer_cast<ex::LlamaImpl>(ref->clone());
    auto report = shardplan::parallelize(*m, plan("llama"), w);
    shardplan::load_checkpoint(dir.string(), *m, report, w);
    std::lock_guard<std::mutex> lock(mu);
    k2[w.rank()] = k_of(*m).detach().clone();
  });
  EXPECT_TRUE(torch::equal(k2[0], k[0]));
  EXPECT_TRUE(torch::equal(k2[1], k[2]));
  fs::remove_all(dir);
}

TEST(Llama, RotaryIsHuggingFacesRotateHalf) {
  // x = e0 at position 1, D = 4: angles (1, 1/theta^(1/2)) per half; the
  // first feature pairs with the third (rotate-half), not the second
  // (interleaved).
  auto x = torch::zeros({1, 1, 1, 4}, torch::kDouble);
  x[0][0][0][0] = 1;
  auto y = ex::apply_rotary(x, 1, 100.0).flatten();
  auto want = torch::tensor({std::cos(1.0), 0.0, std::sin(1.0), 0.0}, torch::kDouble);
  EXPECT_LT((y - want).abs().max().item<double>(), 1e-15) << y;
  // q.k depends on the positions' difference only.
  torch::manual_seed(1);
  auto q = torch::randn({1, 1, 1, 8}, torch::kDouble), k = torch::randn({1, 1, 1, 8}, torch::kDouble);
  auto dot = [&](int64_t m, int64_t n) {
    return (ex::apply_rotary(q, m, 500) * ex::apply_rotary(k, n, 500)).sum().item<double>();
  };
  EXPECT_NEAR(dot(3, 1), dot(7, 5), 1e-12);
  EXPECT_GT(std::abs(dot(3, 1) - dot(3, 2)), 1e-3);
}

// Grouped queries: kv_heads = 2 computes what kv_heads = 4 does with each kv
// head's rows repeated for the query heads that read it (j / 2).
TEST(Llama, GroupedQueryHeadsReadKvHeadJOverGroup) {
  auto gqa = build(config(2)), mha = build(config(4));
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : gqa->named_parameters()) {
      auto target = mha->named_parameters()[p.key()];
      if (target.sizes() == p.value().sizes()) target.copy_(p.value());
      else target.copy_(p.value().view({2, 8, 32}).repeat_interleave(2, 0).reshape({32, 32}));
    }
  }
  const auto t = torch::randint(32, {2, 8}, torch::kLong);
  EXPECT_LT((gqa->forward(t) - mha->forward(t)).abs().max().item<double>(), 1e-12);
  // And the weights matter: another mapping (heads 0,1,2,3 -> 0,1,0,1) differs.
  {
    torch::NoGradGuard no_grad;
    for (const char* name : {"model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight"})
      mha->named_parameters()[name].copy_(
          gqa->named_parameters()[name].view({2, 8, 32}).repeat({2, 1, 1}).reshape({32, 32}));
  }
  EXPECT_GT((gqa->forward(t) - mha->forward(t)).abs().max().item<double>(), 1e-6);
}

TEST(Llama, RMSNormIsLlamaRMSNorm) {
  shardplan::nn::RMSNorm norm(shardplan::nn::RMSNormOptions(6).eps(1e-5));
  norm->to(torch::kDouble);
  {
    torch::NoGradGuard no_grad;
    norm->weight.copy_(torch::linspace(0.5, 2, 6, torch::kDouble));
  }
  auto x = torch::randn({3, 6}, torch::kDouble);
  auto want = x / torch::sqrt(x.pow(2).mean(-1, true) + 1e-5) * norm->weight;
  EXPECT_LT((norm(x) - want).abs().max().item<double>(), 1e-14);
  // bfloat16: statistics in float32, normalised value cast back before the
  // weight multiplies it.
  norm->to(torch::kBFloat16);
  auto xb = x.to(torch::kBFloat16);
  auto xf = xb.to(torch::kFloat);
  auto wantb = norm->weight * (xf * torch::rsqrt(xf.pow(2).mean(-1, true) + 1e-5)).to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(norm(xb), wantb));
  EXPECT_THROW(norm(torch::randn({2, 5}, torch::kBFloat16)), shardplan::Error);
}

std::string plan_error(const ex::Overrides& c, const std::string& plan_name, int world, int64_t head_dim) {
  try {
    auto m = ex::make_model("llama", c);
    shardplan::check_plan(*m.module, plan(plan_name, head_dim), world);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

TEST(Llama, PlanRefusesHeadsThatFitNeitherWay) {
  ex::Overrides three = config(3);
  three["heads"] = "6";
  three["embed"] = "48";
  EXPECT_NE(plan_error(three, "llama", 2, 8).find(
                "parameter 'model.layers.0.self_attn.k_proj.weight': 3 heads of 8 (out_features 24) cannot be split "
                "over mesh axis 'model' of size 2: the heads must divide among the ranks, or the ranks among the "
                "heads (replicate_heads)"),
            std::string::npos)
      << plan_error(three, "llama", 2, 8);
  // Query heads are never replicated: 6 over 4 ranks.
  three["kv_heads"] = "6";
  EXPECT_NE(plan_error(three, "llama", 4, 8).find(
                "parameter 'model.layers.0.self_attn.q_proj.weight': 6 heads of 8 (out_features 48) cannot be split "
                "over mesh axis 'model' of size 4: the heads must divide among the ranks"),
            std::string::npos)
      << plan_error(three, "llama", 4, 8);
  // A head_dim that is not the model's cuts heads: refused.
  EXPECT_NE(plan_error(config(2), "llama", 2, 12).find("head_dim: 12 is not the model's head size 8"),
            std::string::npos);
  EXPECT_EQ(plan_error(config(2), "llama", 4, 8), "no error");
}

// The head size is the model's (nn::Linear's out_head_dim / in_head_dim,
// set by the Llama's attention), not a number the plan must repeat: hidden
// 64 in 4 heads of 16 with 2 kv heads. A plan's head_dim of 32 read that as
// 2 heads of 32 and at 2 ranks computed without an error what one process
// does not.
ex::Overrides heads_of_16() {
  auto c = config(2);
  c["embed"] = "64";
  return c;
}

TEST(Llama, HeadSizeComesFromTheModel) {
  for (const char* name : {"llama", "llama_sp", "llama_async"})
    for (int world : {2, 4}) {
      auto failures = parity::compare(build(heads_of_16()), plan(name), setup(world, torch::kDouble, 2));
      EXPECT_TRUE(failures.empty()) << name << " at " << world << ": " << ::testing::PrintToString(failures);
    }
  // The report speaks of the model's heads: at 4 ranks each holds one of
  // the 2 kv heads of 16.
  auto m = build(heads_of_16());
  for (const auto& row : shardplan::check_plan(*m, plan("llama"), 4).rows)
    if (row.path == "model.layers.0.self_attn.k_proj.weight") {
      EXPECT_EQ(row.local_shape, (std::vector<int64_t>{16, 64}));
      EXPECT_NE(row.note.find("heads replicated: 2 heads over 4 ranks"), std::string::npos) << row.note;
    }
}

// "LINE:COL" of the first `head_dim:` value in plans/NAME.yaml: where the
// q_proj rule's head size is written.
std::string first_head_dim_at(const std::string& name) {
  std::ifstream in(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/" + name + ".yaml");
  std::string line;
  for (int n = 1; std::getline(in, line); ++n)
    if (line.find("head_dim:") != std::string::npos && line.find('#') == std::string::npos)
      return std::to_string(n) + ":" + std::to_string(line.find("head_dim:") + 11);
  return "none";
}

TEST(Llama, PlanHeadSizeOtherThanTheModelsIsRefusedAtItsRule) {
  const std::string want = "llama.yaml:" + first_head_dim_at("llama") +
                           ": head_dim: 32 is not the model's head size 16 for parameter "
                           "'model.layers.0.self_attn.q_proj.weight' (out_features 64: 4 heads of 16); write "
                           "head_dim: auto to take the model's";
  for (int world : {1, 2, 4}) {
    const std::string e = plan_error(heads_of_16(), "llama", world, 32);
    EXPECT_NE(e.find(want), std::string::npos) << "world " << world << ": " << e;
    EXPECT_EQ(e.find("heads of 32"), std::string::npos) << e;
  }
  // The model's own number is accepted, as auto is.
  EXPECT_EQ(plan_error(heads_of_16(), "llama", 4, 16), "no error");
  // auto on a Linear that does not say its head size: the rule is refused.
  auto m = build(heads_of_16());
  try {
    shardplan::check_plan(*m,
                          shardplan::parse_plan("version: 1\nmesh: {model: auto}\nrules:\n"
                                                "  - match: 'model\\.layers\\.\\d+\\.mlp\\.up_proj\\.weight'\n"
                                                "    layout: [model, null]\n    head_dim: auto\n",
                                                "up.yaml"),
                          2);
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("up.yaml:6:15: head_dim: auto, but the model does not say the head size of "
                                         "parameter 'model.layers.0.mlp.up_proj.weight' (its shardplan::nn::Linear's "
                                         "out_head_dim is 0): write the head size as a number"),
              std::string::npos)
        << e.what();
  }
}

TEST(Llama, ConfigErrorsNameTheKey) {
  auto error = [](const ex::Overrides& o) {
    try {
      ex::make_model("llama", o);
    } catch (const shardplan::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error({{"heads", "4"}, {"kv_heads", "3"}}),
            "model 'llama': heads 4 is not divisible by kv_heads 3 (each kv head serves heads/kv_heads query heads)");
  EXPECT_EQ(error({{"embed", "30"}, {"heads", "4"}}), "model 'llama': embed 30 is not divisible by heads 4");
  EXPECT_EQ(error({{"embed", "12"}, {"heads", "4"}, {"kv_heads", "1"}}),
            "model 'llama': the head size embed/heads = 3 must be even (rotary embeddings rotate pairs)");
  EXPECT_EQ(error({{"kv_heads", "0"}}), "model 'llama': kv_heads must be at least 1, got 0");
}

TEST(Llama, HuggingFaceParameterNamesAndTiedHead) {
  auto m = build(config(2));
  auto names = m->named_parameters().keys();
  for (const char* n : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                        "model.layers.1.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
                        "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                        "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
                        "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
                        "model.norm.weight", "lm_head.weight"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  EXPECT_EQ(names.size(), 1u + 2 * 9 + 2);  // no biases
  auto c = config(2);
  c["tie"] = "1";
  auto tied = build(c);
  auto copy = std::dynamic_pointer_cast<ex::LlamaImpl>(tied->clone());
  EXPECT_TRUE(copy->lm_head->weight.is_same(copy->model->embed_tokens->weight));
  auto failures = parity::compare(tied, plan("llama"), setup(2, torch::kDouble, 2));
  EXPECT_TRUE(failures.empty()) << failures.front();
}

// ------------------------------------------------------------ generation

std::vector<ex::Generation> generate_at(int world, int kv, const std::string& plan_name) {
  auto c = config(kv);
  c["context"] = "16";
  auto ref = build(c);
  torch::manual_seed(7);
  const auto prompt = torch::randint(32, {2, 4}, torch::kLong);
  ex::GenerateOptions o;
  o.new_tokens = 10;
  std::vector<ex::Generation> out(world + 1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  out[world] = ex::generate(*std::dynamic_pointer_cast<ex::LlamaImpl>(ref->clone()), prompt, o, gen);
  std::vector<std::shared_ptr<ex::LlamaImpl>> models;
  for (int r = 0; r < world; ++r) models.push_back(std::dynamic_pointer_cast<ex::LlamaImpl>(ref->clone()));
  std::mutex mu;
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    auto& m = *models[w.rank()];
    auto report = shardplan::parallelize(m, plan(plan_name), w);
    ex::GenerateOptions mine = o;
    if (plan_name == "llama_sp") mine.sequence_parts = world;
    auto g = ex::generate(m, prompt, mine, shardplan::current_rng_tracker()->replicated(), &w.comm());
    std::lock_guard<std::mutex> lock(mu);
    out[w.rank()] = g;
  });
  return out;
}

TEST(Llama, GreedyGenerationEqualsUnshardedWithCachesOfOwnKvHeads) {
  struct Case {
    int world, kv;
    const char* plan;
    int64_t ratio_num, ratio_den;  // this rank's cache bytes = unsharded * num / den
  };
  for (const Case& c : {Case{2, 2, "llama", 1, 2}, Case{4, 2, "llama", 1, 2}, Case{4, 1, "llama", 1, 1},
                        Case{4, 4, "llama", 1, 4}, Case{2, 2, "llama_sp", 1, 2}}) {
    auto g = generate_at(c.world, c.kv, c.plan);
    const auto& want = g[c.world];
    for (int r = 0; r < c.world; ++r) {
      EXPECT_TRUE(torch::equal(g[r].tokens, want.tokens)) << c.plan << " world " << c.world << " kv " << c.kv;
      EXPECT_EQ(g[r].cache_bytes * c.ratio_den, want.cache_bytes * c.ratio_num)
          << c.plan << " world " << c.world << " kv " << c.kv;
    }
  }
}

TEST(Llama, IncrementalDecodingEqualsTheFullSequence) {
  auto m = build(config(2));
  torch::NoGradGuard no_grad;
  const auto t = torch::randint(32, {2, 8}, torch::kLong);
  const auto full = m->forward(t).transpose(0, 1);  // [T, B, V]
  auto caches = m->make_caches();
  auto first = m->forward_cached(t.narrow(1, 0, 5), caches);
  std::vector<torch::Tensor> parts = {first};
  for (int64_t i = 5; i < 8; ++i) parts.push_back(m->forward_cached(t.narrow(1, i, 1), caches));
  EXPECT_LT((torch::cat(parts, 0) - full).abs().max().item<double>(), 1e-12);
  EXPECT_EQ(m->cache_bytes(2).unsharded, 2 * 2 * 2 * 8 * 2 * 8 * 8);  // k+v, layers, B, context, kv heads, D, f64
}

}  // namespace

}  // namespace test_llama
