#include "models/hf_config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "shardplan/error.h"

namespace shardplan {
namespace examples {
namespace {

using json = nlohmann::json;

// LlamaForCausalLM's config keys and the example's (models/llama.h).
struct Key {
  const char* hf;
  const char* ours;
  bool integer;
};
constexpr Key kLlamaKeys[] = {
    {"vocab_size", "vocab", true},          {"max_position_embeddings", "context", true},
    {"hidden_size", "embed", true},         {"num_attention_heads", "heads", true},
    {"num_key_value_heads", "kv_heads", true}, {"num_hidden_layers", "layers", true},
    {"intermediate_size", "mlp", true},     {"rope_theta", "rope_theta", false},
    {"rms_norm_eps", "rms_eps", false},
};

[[noreturn]] void bad(const std::string& path, const std::string& why) { throw Error(path + ": " + why); }

std::string number_text(const json& v) {
  std::ostringstream s;
  s.precision(17);
  s << v.get<double>();
  return s.str();
}

// What the example does not do must not be ignored: its weights would load
// and compute something else.
void refuse_unsupported(const std::string& path, const json& j) {
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    bad(path, "rope_scaling is set; the example's rotary embedding has no scaling");
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (j.contains(key) && j[key] != false) bad(path, std::string(key) + " is set; the example's layers have no biases");
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    bad(path, "hidden_act is " + j["hidden_act"].dump() + "; the example's MLP is SwiGLU (silu)");
  if (j.contains("head_dim") && !j["head_dim"].is_null() && j.contains("hidden_size") &&
      j.contains("num_attention_heads")) {
    const auto hidden = j["hidden_size"].get<long long>(), heads = j["num_attention_heads"].get<long long>();
    if (!j["head_dim"].is_number_integer() || heads <= 0 || j["head_dim"].get<long long>() * heads != hidden)
      bad(path, "head_dim " + j["head_dim"].dump() + " is not hidden_size / num_attention_heads; the example's is");
  }
}

}  // namespace

std::string find_hf_config(const std::string& weights_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(weights_path);
  const fs::path candidate = fs::is_directory(p, ec) ? p / "config.json" : p.parent_path() / "config.json";
  return fs::is_regular_file(candidate, ec) ? candidate.string() : "";
}

Overrides read_hf_config(const std::string& path, const std::string& model) {
  if (model != "llama") bad(path, "a Hugging Face config describes the llama example only, not '" + model + "'");
  std::ifstream in(path);
  if (!in) bad(path, "cannot be read");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    bad(path, std::string("not JSON: ") + e.what());
  }
  if (!j.is_object()) bad(path, "not a JSON object");
  Overrides out;
  try {
    refuse_unsupported(path, j);
    for (const Key& k : kLlamaKeys) {
      if (!j.contains(k.hf) || j[k.hf].is_null()) continue;
      const json& v = j[k.hf];
      if (k.integer ? !v.is_number_integer() : !v.is_number())
        bad(path, std::string(k.hf) + " is " + v.dump() + ", not " + (k.integer ? "an integer" : "a number"));
      out[k.ours] = k.integer ? std::to_string(v.get<long long>()) : number_text(v);
    }
    if (j.contains("tie_word_embeddings")) {
      if (!j["tie_word_embeddings"].is_boolean()) bad(path, "tie_word_embeddings is not true or false");
      out["tie"] = j["tie_word_embeddings"].get<bool>() ? "1" : "0";
    }
  } catch (const json::exception& e) {
    bad(path, e.what());
  }
  // Hugging Face's default: as many kv heads as heads.
  if (!out.count("kv_heads") && out.count("heads")) out["kv_heads"] = out["heads"];
  return out;
}

std::string hf_config_json(const std::string& model, const std::string& config_str, const std::string& dtype) {
  if (model != "llama") return "";
  Overrides ours;
  std::istringstream items(config_str);
  for (std::string item; items >> item;) {
    const auto eq = item.find('=');
    if (eq != std::string::npos) ours[item.substr(0, eq)] = item.substr(eq + 1);
  }
  json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_act", "silu"},
            {"attention_bias", false}, {"torch_dtype", dtype}};
  for (const Key& k : kLlamaKeys) {
    const auto it = ours.find(k.ours);
    if (it == ours.end()) continue;
    if (k.integer)
      j[k.hf] = std::stoll(it->second);
    else
      j[k.hf] = std::stod(it->second);
  }
  j["tie_word_embeddings"] = ours.count("tie") && ours["tie"] == "1";
  return j.dump(2) + "\n";
}

}  // namespace examples
}  // namespace shardplan
