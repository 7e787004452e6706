#include "models/families/phi3.h"

namespace shardplan {
namespace examples {

const LlamaConfig* phi3_config_of(const torch::nn::Module& model) {
  const auto* llama = dynamic_cast<const LlamaImpl*>(&model);
  return llama && llama->config.family == "phi3" ? &llama->config : nullptr;
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

}  // namespace examples
}  // namespace shardplan
