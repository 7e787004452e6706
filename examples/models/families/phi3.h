#pragma once
// Phi-3 checkpoints (config.json model_type "phi3", Phi3ForCausalLM) over
// the Llama example: the same computation (RMSNorm, rotate-half rotary,
// grouped-query attention, SwiGLU with silu on gate_up's first half), with
// q/k/v stored as one qkv_proj tensor and gate/up as one gate_up_proj. The
// model keeps separate projections, so plans/llama.yaml and --plan auto cut
// it as any Llama; these rules cut the fused tensors on load (each rank
// reads only its rows of each part) and re-fuse them on save.
#include <string>
#include <utility>
#include <vector>

#include "models/llama.h"
#include "shardplan/weights.h"

namespace shardplan {
namespace examples {

// Whether the config.json beside weights `weights_path` (find_hf_config)
// has model_type phi3: the trainers then load and save through the rules
// below.
bool is_phi3_checkpoint(const std::string& weights_path);

// The Llama example's config, which a Phi-3 checkpoint loads into; throws
// Error (one line) for another model.
const LlamaConfig& phi3_model_config(const torch::nn::Module& model);

// WeightsOptions::fused for a Phi-3 file of config `c`: qkv_proj into
// q_proj (heads x head_dim rows), k_proj and v_proj (kv_heads x head_dim
// each); gate_up_proj into gate_proj and up_proj (intermediate_size each).
std::vector<WeightsOptions::FusedWeight> phi3_load_fused(const LlamaConfig& c);

// SaveWeightsOptions::fused writing those tensors back under Phi-3's names.
std::vector<std::pair<std::string, std::vector<std::string>>> phi3_save_fused(const LlamaConfig& c);

// The Llama config.json `llama_json` (hf_config_json) as Phi-3's.
std::string phi3_config_json(const std::string& llama_json);

}  // namespace examples
}  // namespace shardplan
