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

// The config of `model` when it is the Llama example computing family
// phi3 (config.json model_type phi3), else nullptr: the trainers then load
// and save through the rules below.
const LlamaConfig* phi3_config_of(const torch::nn::Module& model);

// WeightsOptions::fused for a Phi-3 file of config `c`: qkv_proj into
// q_proj (heads x head_dim rows), k_proj and v_proj (kv_heads x head_dim
// each); gate_up_proj into gate_proj and up_proj (intermediate_size each).
std::vector<WeightsOptions::FusedWeight> phi3_load_fused(const LlamaConfig& c);

// SaveWeightsOptions::fused writing those tensors back under Phi-3's names.
std::vector<std::pair<std::string, std::vector<std::string>>> phi3_save_fused(const LlamaConfig& c);

}  // namespace examples
}  // namespace shardplan
