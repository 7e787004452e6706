// GPT-2's config.json (model_type gpt2): a placeholder until the GPT-2
// example lands, refusing in one line rather than building something else.
#include "models/hf_config_family.h"
#include "shardplan/error.h"

namespace shardplan {
namespace examples {

Overrides read_gpt2_config(const nlohmann::json&, const std::string& path) {
  throw Error(path + ": model_type gpt2 has no example model in this build");
}

nlohmann::json gpt2_config_json(const Overrides&) { return nlohmann::json(); }

}  // namespace examples
}  // namespace shardplan
