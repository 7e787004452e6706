#pragma once
// Hugging Face's config.json, the file beside a model's weights that says
// the model's shape, read into and written from the example models' config
// overrides, so that `--load-weights DIR` needs no other flag and
// `--save-weights DIR` gives a directory transformers can load. Llama only:
// the other examples have no Hugging Face twin. Torch-free.
#include <map>
#include <string>

namespace shardplan {
namespace examples {

// As models/model.h has it (the same alias again, so that this header and
// hf_config.cpp build without torch, for the fuzz target).
using Overrides = std::map<std::string, std::string>;

// The config.json that belongs to weights at `weights_path` (the directory's
// own, or the one beside a file), or "" when there is none.
std::string find_hf_config(const std::string& weights_path);

// The overrides config.json file `path` gives model `model` ("llama"). A key
// the example has no twin for is ignored unless it asks for something the
// model does not do (rope_scaling, biases, an activation other than silu,
// a head_dim other than hidden_size / heads): that is an error naming the
// file and the key, as is a value of the wrong type.
Overrides read_hf_config(const std::string& path, const std::string& model);
// The same for the text of config.json `path` (the fuzz target's way in).
Overrides read_hf_config_text(const std::string& text, const std::string& path, const std::string& model);

// config.json file `path`'s model_type, "" when it has none (read and
// refused as read_hf_config reads and refuses a file).
std::string hf_model_type(const std::string& path);

// config.json for `model` with `config_str` ("vocab=256 context=64 ...",
// ExampleModel::config_str()), or "" for a model with no Hugging Face twin.
std::string hf_config_json(const std::string& model, const std::string& config_str, const std::string& dtype);

}  // namespace examples
}  // namespace shardplan
