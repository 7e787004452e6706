#include "models/families/phi3.h"

#include <nlohmann/json.hpp>

#include "models/hf_config.h"
#include "shardplan/error.h"

namespace shardplan {
namespace examples {

bool is_phi3_checkpoint(const std::string& weights_path) {
  const std::string json = find_hf_config(weights_path);
  return !json.empty() && hf_model_type(json) == "phi3";
}

const LlamaConfig& phi3_model_config(const torch::nn::Module& model) {
  const auto* llama = dynamic_cast<const LlamaImpl*>(&model);
  if (!llama) throw Error("a Phi-3 checkpoint (config.json model_type phi3) loads into --model llama only");
  return llama->config;
}

std::vector<WeightsOptions::FusedWeight> phi3_load_fused(const LlamaConfig& c) {
  const int64_t d = c.head_dim();
  return {{R"((model\.layers\.\d+\.self_attn)\.qkv_proj\.weight)",
           {{"$1.q_proj.weight", c.heads * d}, {"$1.k_proj.weight", c.kv_heads * d}, {"$1.v_proj.weight", c.kv_heads * d}}},
          {R"((model\.layers\.\d+\.mlp)\.gate_up_proj\.weight)", {{"$1.gate_proj.weight", c.mlp}, {"$1.up_proj.weight", c.mlp}}}};
}

std::vector<std::pair<std::string, std::vector<std::string>>> phi3_save_fused(const LlamaConfig& c) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string a = "model.layers." + std::to_string(i) + ".self_attn.";
    const std::string m = "model.layers." + std::to_string(i) + ".mlp.";
    out.push_back({a + "qkv_proj.weight", {a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"}});
    out.push_back({m + "gate_up_proj.weight", {m + "gate_proj.weight", m + "up_proj.weight"}});
  }
  return out;
}

std::string phi3_config_json(const std::string& llama_json) {
  nlohmann::json j = nlohmann::json::parse(llama_json);
  j["architectures"] = {"Phi3ForCausalLM"};
  j["model_type"] = "phi3";
  j.erase("attention_bias");  // Phi3Config has none: its projections never have biases
  j["rope_scaling"] = nullptr;
  j["sliding_window"] = nullptr;  // attention over the whole context, as the example computes
  return j.dump(2) + "\n";
}

}  // namespace examples
}  // namespace shardplan
