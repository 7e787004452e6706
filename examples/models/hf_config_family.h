#pragma once
// One model_type's config.json reader and writer (models/hf_config.cpp's
// table). The families the llama example computes are in hf_config.cpp;
// gpt2's are GPT-2 example's own (hf_config_gpt2.cpp). Torch-free.
#include <nlohmann/json.hpp>
#include <string>

#include "models/hf_config.h"

namespace shardplan {
namespace examples {

// config.json (parsed, an object) at `path` -> the example's overrides;
// throws shardplan::Error naming `path` and the key for what the example
// cannot compute.
using HfConfigReader = Overrides (*)(const nlohmann::json& config, const std::string& path);
// The example's config_str() items -> config.json's object (model_type,
// architectures and torch_dtype are added by the caller).
using HfConfigWriter = nlohmann::json (*)(const Overrides& ours);

Overrides read_gpt2_config(const nlohmann::json& config, const std::string& path);
nlohmann::json gpt2_config_json(const Overrides& ours);

}  // namespace examples
}  // namespace shardplan
