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

// config.json's text (from file `path`) parsed, its nesting bounded while
// parsing; not JSON, too deep or not an object is an Error naming `path`.
nlohmann::json parse_hf_config(const std::string& text, const std::string& path);
// The text of config.json `path`: a regular file (a pipe would block) of at
// most 16 MiB, else an Error naming it.
std::string read_hf_config_file(const std::string& path);

Overrides read_gpt2_config(const nlohmann::json& config, const std::string& path);
nlohmann::json gpt2_config_json(const Overrides& ours);

}  // namespace examples
}  // namespace shardplan
