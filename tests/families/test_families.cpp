// The Llama-like families the llama example computes by config.json's
// model_type (examples/models/hf_config.cpp, llama.h's `family`): each
// family's keys read and written back, its missing and refused keys one
// error naming the file and key; qwen2, mistral (a window shorter than the
// sequence) and gemma (head_dim other than embed / heads, tied) train under
// plans/llama.yaml like one process (float64, 1e-10) at 2 and 4 ranks with 2
// and 1 kv heads, the bias following its weight; auto_plan makes the
// written plan's cut; a windowed KV cache holds the window only and decodes
// as the full sequence does.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <regex>
#include <string>
#include <vector>

#include "../llama_fixture.h"
#include "models/hf_config.h"
#include "models/llama.h"
#include "../parity.h"
#include "shardplan/auto_plan.h"
#include "shardplan/error.h"
#include "shardplan/nn/kv_cache.h"
#include "shardplan/parallelize.h"

namespace test_families {
namespace {

namespace ex = shardplan::examples;

// The fixture's small Llama (embed 32, 4 heads) as `family`.
ex::Overrides family_config(const std::string& family, int kv_heads) {
  ex::Overrides c = llama_fixture::config(kv_heads);
  c["family"] = family;
  if (family == "mistral") c["window"] = "3";  // shorter than the 8 positions trained
  if (family == "gemma") {
    c["head_dim"] = "12";  // not 32 / 4
    c["tie"] = "1";
  }
  return c;
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one with " << ::testing::PrintToString(parts);
  } catch (const shardplan::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    for (const auto& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
}

std::string json_of(const std::string& type, const std::string& extra) {
  return R"({"model_type": ")" + type +
         R"(", "vocab_size": 32, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
             "num_hidden_layers": 2, "intermediate_size": 24, "max_position_embeddings": 8)" +
         extra + "}";
}

TEST(FamilyConfig, EachModelTypeReadsItsKeys) {
  auto q = ex::read_hf_config_text(json_of("qwen2", R"(, "use_sliding_window": false, "sliding_window": 4)"), "c.json",
                                   "llama");
  EXPECT_EQ(q.at("family"), "qwen2");
  EXPECT_EQ(q.count("window"), 0u);  // ignored without use_sliding_window, as Qwen2 does
  auto m = ex::read_hf_config_text(json_of("mistral", R"(, "sliding_window": 4)"), "c.json", "llama");
  EXPECT_EQ(m.at("family"), "mistral");
  EXPECT_EQ(m.at("window"), "4");
  EXPECT_EQ(ex::read_hf_config_text(json_of("mistral", R"(, "sliding_window": null)"), "c.json", "llama").count("window"),
            0u);
  auto g = ex::read_hf_config_text(json_of("gemma", R"(, "head_dim": 12)"), "c.json", "llama");
  EXPECT_EQ(g.at("family"), "gemma");
  EXPECT_EQ(g.at("head_dim"), "12");
  EXPECT_EQ(g.at("tie"), "1");  // GemmaConfig's default
  auto p = ex::read_hf_config_text(json_of("phi3", R"(, "partial_rotary_factor": 1.0)"), "c.json", "llama");
  EXPECT_EQ(p.at("family"), "phi3");
  EXPECT_EQ(ex::read_hf_config_text(json_of("llama", ""), "c.json", "llama").at("family"), "llama");
  EXPECT_EQ(ex::hf_example_for("qwen2"), "llama");
  EXPECT_EQ(ex::hf_example_for("gpt2"), "gpt2");
  EXPECT_EQ(ex::hf_example_for("bert"), "");
}

TEST(FamilyConfig, BadConfigsAreOneLineNamingFileAndKey) {
  expect_error([] { ex::read_hf_config_text(json_of("bert", ""), "c.json", "llama"); },
               {"c.json", "model_type \"bert\"", "llama, qwen2, mistral, gemma, phi3, gpt2"});
  expect_error([] { ex::read_hf_config_text(json_of("mistral", ""), "c.json", "llama"); },
               {"c.json", "sliding_window is missing"});
  expect_error([] { ex::read_hf_config_text(json_of("gemma", ""), "c.json", "llama"); }, {"c.json", "head_dim is missing"});
  expect_error([] { ex::read_hf_config_text(R"({"model_type": "qwen2", "hidden_size": 32})", "c.json", "llama"); },
               {"c.json", "vocab_size is missing"});
  expect_error([] { ex::read_hf_config_text(json_of("qwen2", R"(, "use_sliding_window": true)"), "c.json", "llama"); },
               {"c.json", "use_sliding_window"});
  expect_error([] { ex::read_hf_config_text(json_of("gemma", R"(, "head_dim": 8, "hidden_activation": "gelu")"), "c.json",
                                            "llama"); },
               {"c.json", "hidden_activation"});
  expect_error([] { ex::read_hf_config_text(json_of("phi3", R"(, "partial_rotary_factor": 0.5)"), "c.json", "llama"); },
               {"c.json", "partial_rotary_factor"});
  expect_error([] { ex::read_hf_config_text(json_of("mistral", R"(, "sliding_window": 4, "rope_scaling": {"type": "linear"})"),
                                            "c.json", "llama"); },
               {"c.json", "rope_scaling"});
  expect_error([] { ex::read_hf_config_text(json_of("qwen2", ""), "c.json", "gpt"); }, {"c.json", "'gpt'"});
  expect_error([] { ex::read_hf_config_text(json_of("gpt2", ""), "c.json", "llama"); }, {"c.json", "gpt2"});
}

TEST(FamilyConfig, SavedConfigReadsBackTheSameModel) {
  for (const std::string family : {"llama", "qwen2", "mistral", "gemma", "phi3"}) {
    SCOPED_TRACE(family);
    const ex::LlamaConfig c = ex::LlamaConfig::from(family_config(family, 2));
    const std::string json = ex::hf_config_json("llama", c.str(), "float32");
    EXPECT_NE(json.find("\"model_type\": \"" + family + "\""), std::string::npos) << json;
    const ex::LlamaConfig back = ex::LlamaConfig::from(ex::read_hf_config_text(json, "config.json", "llama"));
    EXPECT_EQ(back.str(), c.str()) << json;
  }
  EXPECT_NE(ex::hf_config_json("llama", "family=gemma embed=32 heads=4", "float32").find("GemmaForCausalLM"),
            std::string::npos);
}

TEST(FamilyConfig, OptionsAFamilyCannotSaveAreRefused) {
  auto c = family_config("qwen2", 2);
  c["window"] = "3";
  expect_error([&] { ex::LlamaConfig::from(c); }, {"window", "mistral"});
  c = family_config("llama", 2);
  c["head_dim"] = "12";
  expect_error([&] { ex::LlamaConfig::from(c); }, {"head_dim 12"});
  c["family"] = "bert";
  expect_error([&] { ex::LlamaConfig::from(c); }, {"family 'bert'"});
}

// A bias is cut as its weight's rows are: the weight's rule applied to it as a column.
parity::Setup family_setup(int world, int kv_heads) {
  parity::Setup s = llama_fixture::setup(world, torch::kDouble, kv_heads);
  const auto weights = s.local;
  s.local = [weights](const std::string& name, const torch::Tensor& full, int rank, int world_size) {
    static const std::regex bias(R"((.*_proj)\.bias)");
    std::smatch m;
    if (!std::regex_match(name, m, bias)) return weights(name, full, rank, world_size);
    return weights(m[1].str() + ".weight", full.unsqueeze(1), rank, world_size).squeeze(1);
  };
  return s;
}

TEST(FamilyTraining, ShardedEqualsUnshardedFloat64) {
  for (const std::string family : {"qwen2", "mistral", "gemma"})
    for (int kv : {2, 1})
      for (int world : {2, 4}) {
        auto m = llama_fixture::build(family_config(family, kv));
        const auto failures = parity::compare(m, llama_fixture::plan("llama"), family_setup(world, kv));
        EXPECT_TRUE(failures.empty()) << family << " kv_heads " << kv << " world " << world << ":\n"
                                      << ::testing::PrintToString(failures);
      }
}

// Sequence parallelism (plans/llama_sp.yaml): the norms run on this rank's
// positions (gemma's 1 + w through the layer_norm plugin's strategy), the
// biases after the sequence gather.
TEST(FamilyTraining, SequenceParallelEqualsUnshardedFloat64) {
  for (const std::string family : {"qwen2", "mistral", "gemma"})
    for (int world : {2, 4}) {
      auto m = llama_fixture::build(family_config(family, 2));
      const auto failures = parity::compare(m, llama_fixture::plan("llama_sp"), family_setup(world, 2));
      EXPECT_TRUE(failures.empty()) << family << " world " << world << ":\n" << ::testing::PrintToString(failures);
    }
}

using llama_fixture::auto_plan_of;

TEST(FamilyAutoPlan, CutsAsTheWrittenPlan) {
  for (const std::string family : {"qwen2", "mistral", "gemma"})
    for (int kv : {2, 1})
      for (int world : {2, 4}) {
        SCOPED_TRACE(family + " kv_heads " + std::to_string(kv) + " world " + std::to_string(world));
        auto m = llama_fixture::build(family_config(family, kv));
        const shardplan::Plan automatic = auto_plan_of(*m, world), hand = llama_fixture::plan("llama");
        for (int rank = 0; rank < world; ++rank) {
          const auto a = shardplan::check_plan(*m, automatic, world, rank);
          const auto b = shardplan::check_plan(*m, hand, world, rank);
          ASSERT_EQ(a.rows.size(), b.rows.size()) << automatic.to_yaml();
          for (size_t i = 0; i < a.rows.size(); ++i) {
            ASSERT_EQ(a.rows[i].path, b.rows[i].path);
            EXPECT_EQ(a.rows[i].layout, b.rows[i].layout) << a.rows[i].path;
            EXPECT_EQ(a.rows[i].local_shape, b.rows[i].local_shape) << a.rows[i].path << " rank " << rank;
          }
        }
      }
}

TEST(FamilyModel, GemmaHeadDimShapesTheProjections) {
  auto m = llama_fixture::build(family_config("gemma", 1));
  const auto& attn = m->model->layers->ptr<ex::LlamaDecoderLayerImpl>(0)->self_attn;
  EXPECT_EQ(attn->q_proj->weight.sizes(), torch::IntArrayRef({48, 32}));
  EXPECT_EQ(attn->k_proj->weight.sizes(), torch::IntArrayRef({12, 32}));
  EXPECT_EQ(attn->o_proj->weight.sizes(), torch::IntArrayRef({32, 48}));
  EXPECT_TRUE(m->lm_head->weight.is_same(m->model->embed_tokens->weight));
}

// Gemma's head_dim 12 is not embed / heads = 8: the plan's head_dim: auto
// takes 12, and a plan that says 8 is refused at its rule naming both.
TEST(FamilyModel, GemmaPlanHeadDimIsTheModels) {
  auto m = llama_fixture::build(family_config("gemma", 2));
  for (const auto& row : shardplan::check_plan(*m, llama_fixture::plan("llama"), 2).rows)
    if (row.path == "model.layers.0.self_attn.q_proj.weight")
      EXPECT_EQ(row.local_shape, (std::vector<int64_t>{24, 32}));
  try {
    shardplan::check_plan(*m, llama_fixture::plan("llama", 8), 2);
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim: 8 is not the model's head size 12"), std::string::npos) << e.what();
  }
}

TEST(FamilyModel, WindowedCacheHoldsTheWindowAndDecodesAsTheFullSequence) {
  shardplan::nn::KVCache cache(8, 3);
  const auto k = torch::arange(5 * 2, torch::kDouble).view({1, 5, 2});
  auto kv = cache.append(k.narrow(1, 0, 4), k.narrow(1, 0, 4));
  EXPECT_EQ(kv.first.size(1), 4);  // a prefill sees all its keys
  EXPECT_EQ(cache.held(), 3);
  EXPECT_EQ(cache.length(), 4);
  EXPECT_EQ(cache.bytes(), 2 * 3 * 2 * 8);
  kv = cache.append(k.narrow(1, 4, 1), k.narrow(1, 4, 1));
  EXPECT_TRUE(kv.first.equal(k.narrow(1, 1, 4)));  // the 3 held and the new one
  EXPECT_TRUE(cache.key().equal(k.narrow(1, 2, 3)));

  // Decoding one position at a time through caches of 3 positions gives the
  // logits of the full 8-position forward.
  auto m = llama_fixture::build(family_config("mistral", 2));
  torch::NoGradGuard no_grad;
  const auto tokens = torch::randint(32, {1, 8}, torch::kLong);
  const auto full = m->forward(tokens);
  auto caches = m->make_caches();
  const auto prefill = m->forward_cached(tokens.narrow(1, 0, 5), caches);  // [T, B, V]
  std::vector<torch::Tensor> steps{prefill.transpose(0, 1)};
  for (int i = 5; i < 8; ++i) steps.push_back(m->forward_cached(tokens.narrow(1, i, 1), caches).transpose(0, 1));
  EXPECT_LT((torch::cat(steps, 1) - full).abs().max().item<double>(), 1e-12);
  EXPECT_EQ(caches[0].held(), 3);
  EXPECT_EQ(m->cache_bytes(1).this_rank, 2 * 2 * 2 * 3 * 8 * 8);  // k and v, 2 layers, 2 kv heads, 3 positions, d 8
  // The window matters: without it the logits differ.
  auto c = family_config("mistral", 2);
  c["window"] = "0";
  auto whole = llama_fixture::build(c);
  EXPECT_GT((whole->forward(tokens) - full).abs().max().item<double>(), 1e-6);
}

}  // namespace
}  // namespace test_families
