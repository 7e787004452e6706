// GPT-2's config.json and file names (examples/models/hf_config_gpt2.h):
// the sizes read into the gpt2 example's overrides, what the example does
// not compute refused in one line naming the file and the key, the config
// written by --save-weights read back to the same model, and both name
// forms of GPT-2's files renamed to the model's.
#include <gtest/gtest.h>

#include <string>

#include "models/gpt2.h"
#include "models/hf_config_gpt2.h"
#include "shardplan/error.h"
#include "shardplan/weights.h"

namespace test_weights_gpt2_config {

namespace {

namespace ex = shardplan::examples;

const std::string kSizes = R"("n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 32, "vocab_size": 256)";

ex::Overrides read(const std::string& extra) {
  return ex::read_gpt2_config_text("{" + kSizes + extra + "}", "dir/config.json");
}

std::string refusal(const std::string& text) {
  try {
    ex::read_gpt2_config_text(text, "dir/config.json");
  } catch (const shardplan::Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(GPT2Config, SizesAndDefaults) {
  EXPECT_EQ(read(""), (ex::Overrides{{"embed", "64"}, {"layers", "2"}, {"heads", "4"}, {"context", "32"},
                                     {"vocab", "256"}, {"mlp", "256"}}));  // n_inner: 4 * n_embd
  const auto o = read(R"(, "n_inner": 96, "layer_norm_epsilon": 1e-6, "activation_function": "gelu_new",
                         "scale_attn_weights": true, "tie_word_embeddings": true, "n_inner_unknown_key": 1)");
  EXPECT_EQ(o.at("mlp"), "96");
  EXPECT_EQ(std::stod(o.at("ln_eps")), 1e-6);
  EXPECT_EQ(read(R"(, "n_inner": null)").at("mlp"), "256");
}

TEST(GPT2Config, WhatTheExampleDoesNotComputeIsOneLineNamingTheKey) {
  const std::pair<std::string, std::string> cases[] = {
      {R"(, "activation_function": "gelu")", "activation_function"},
      {R"(, "activation_function": "relu")", "activation_function"},
      {R"(, "scale_attn_weights": false)", "scale_attn_weights"},
      {R"(, "tie_word_embeddings": false)", "tie_word_embeddings"},
      {R"(, "scale_attn_by_inverse_layer_idx": true)", "scale_attn_by_inverse_layer_idx"},
      {R"(, "reorder_and_upcast_attn": true)", "reorder_and_upcast_attn"},
      {R"(, "add_cross_attention": true)", "add_cross_attention"},
      {R"(, "model_type": "llama")", "model_type"},
      {R"(, "n_inner": "96")", "n_inner"},
      {R"(, "n_inner": 0)", "n_inner"},
      {R"(, "layer_norm_epsilon": -1)", "layer_norm_epsilon"},
      {R"(, "scale_attn_weights": "yes")", "scale_attn_weights"}};
  for (const auto& [extra, key] : cases) {
    const std::string msg = refusal("{" + kSizes + extra + "}");
    EXPECT_NE(msg.find("dir/config.json: "), std::string::npos) << extra << ": " << msg;
    EXPECT_NE(msg.find(key), std::string::npos) << extra << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  for (const char* key : {"n_embd", "n_layer", "n_head", "n_positions", "vocab_size"}) {
    std::string text = "{" + kSizes + "}";
    text.replace(text.find(std::string("\"") + key + "\""), 1, "\"x_");  // the key is gone
    EXPECT_NE(refusal(text).find(std::string("lacks ") + key), std::string::npos) << refusal(text);
  }
  EXPECT_NE(refusal(R"({"n_embd": 1e40})").find("n_embd"), std::string::npos);
  EXPECT_NE(refusal("[1]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(refusal(std::string(100, '[') + std::string(100, ']')).find("levels deep"), std::string::npos);
}

TEST(GPT2Config, TheSavedConfigReadsBackToTheSameModel) {
  ex::GPT2Config c;
  c.vocab = 96;
  c.context = 24;
  c.embed = 48;
  c.heads = 6;
  c.layers = 3;
  c.mlp = 80;
  c.ln_eps = 3e-6;
  const std::string json = ex::gpt2_config_json(c.str(), "float32");
  EXPECT_EQ(ex::GPT2Config::from(ex::read_gpt2_config_text(json, "saved/config.json")).str(), c.str());
}

TEST(GPT2Config, BothNameFormsOfGPT2FilesRenameToTheModels) {
  const auto layout = ex::gpt2_file_layout();
  shardplan::WeightsOptions o;
  o.rename = layout.rename;
  for (const std::string name : {"h.0.attn.c_attn.weight", "wte.weight", "wpe.weight", "ln_f.bias", "h.11.mlp.c_fc.bias"})
    EXPECT_EQ(shardplan::renamed_weight_name(o, name), "transformer." + name);
  for (const std::string name : {"transformer.h.0.attn.c_attn.weight", "lm_head.weight", "transformer.wte.weight"})
    EXPECT_EQ(shardplan::renamed_weight_name(o, name), name);
}

}  // namespace

}  // namespace test_weights_gpt2_config
