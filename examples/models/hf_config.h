#pragma once
// Hugging Face's config.json, the file beside a model's weights that says
// the model's shape, read into and written from the example models' config
// overrides, so that `--load-weights DIR` needs no other flag and
// `--save-weights DIR` gives a directory transformers can load. One table
// row per `model_type`: llama, qwen2, mistral, gemma and phi3 are computed by
// the llama example (models/llama.h, its `family` option saying which),
// gpt2 by its own example (models/hf_config_family.h's hook). Torch-free.
#include <map>
#include <string>
#include <vector>

namespace shardplan {
namespace examples {

// As models/model.h has it (the same alias again, so that this header and
// hf_config.cpp build without torch, for the fuzz target).
using Overrides = std::map<std::string, std::string>;

// The config.json that belongs to weights at `weights_path` (the directory's
// own, or the one beside a file), or "" when there is none.
std::string find_hf_config(const std::string& weights_path);

// The model_type values a config.json may hold, in the table's order.
std::vector<std::string> hf_model_types();
// The example model that computes `model_type` ("llama" for the Llama-like
// families), or "" for a type the table does not know.
std::string hf_example_for(const std::string& model_type);

// The example model to train on the weights at `weights`: `model` when
// there is no config.json beside them, else the one its model_type names.
// A `model` the user `given` that is not that one (--model gpt for a qwen2
// directory) is an error naming both and the file.
std::string hf_model_for_weights(const std::string& weights, const std::string& model, bool given);

// The overrides config.json file `path` gives example model `model`
// ("llama", or a family the llama example computes). The model_type picks
// the family's reader: an unknown one is an error listing the known ones, as
// is one another example computes. A key the family cannot do without that
// is missing, a key the example has no twin for that asks for something the
// model does not do (rope_scaling, ...), and a value of the wrong type are
// errors naming the file and the key. The overrides carry `family` (the
// model_type) for the llama example.
Overrides read_hf_config(const std::string& path, const std::string& model);
// The same for the text of config.json `path` (the fuzz target's way in).
Overrides read_hf_config_text(const std::string& text, const std::string& path, const std::string& model);

// config.json for `model` with `config_str` ("vocab=256 context=64 ...",
// ExampleModel::config_str()) in the family's own keys and architecture,
// or "" for a model with no Hugging Face twin.
std::string hf_config_json(const std::string& model, const std::string& config_str, const std::string& dtype);

}  // namespace examples
}  // namespace shardplan
