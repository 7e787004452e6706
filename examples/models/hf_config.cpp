#include "models/hf_config.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
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

// The value as an int64, or nullopt: a float, or an unsigned past INT64_MAX.
std::optional<long long> int64_of(const json& v) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<unsigned long long>() > INT64_MAX))
    return std::nullopt;
  return v.get<long long>();
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
    // Sizes that are not whole int64 numbers are named by the key check
    // after this (get<long long> of 4e43 is undefined behaviour). Divided,
    // not multiplied: a head_dim near 2^63 would overflow.
    const auto hidden = int64_of(j["hidden_size"]), heads = int64_of(j["num_attention_heads"]);
    const auto head_dim = int64_of(j["head_dim"]);
    if (hidden && heads && (!head_dim || *heads <= 0 || *hidden % *heads != 0 || *head_dim != *hidden / *heads))
      bad(path, "head_dim " + j["head_dim"].dump() + " is not hidden_size / num_attention_heads; the example's is");
  }
}

// Nesting deeper than this is refused while parsing: a config is flat, and
// dump() of a deep value (for a message) would recurse once per level.
constexpr int kMaxJsonDepth = 32;

json parse_config(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text, [&](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth) bad(path, "nests values more than " + std::to_string(kMaxJsonDepth) + " levels deep");
      return true;
    });
  } catch (const json::exception& e) {
    bad(path, std::string("not JSON: ") + e.what());
  }
  if (!j.is_object()) bad(path, "not a JSON object");
  return j;
}

}  // namespace

std::string find_hf_config(const std::string& weights_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(weights_path);
  const fs::path candidate = fs::is_directory(p, ec) ? p / "config.json" : p.parent_path() / "config.json";
  // One that is there but not a file is returned, for read_hf_config to refuse.
  return fs::exists(candidate, ec) ? candidate.string() : "";
}

namespace {

std::string read_config_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // Before opening: opening a named pipe would wait for a writer.
  if (!fs::is_regular_file(path, ec)) bad(path, "is not a regular file (a pipe, device or directory is not read)");
  // A config is a few hundred bytes; 16 MiB leaves room for any comment-laden one.
  if (fs::file_size(path, ec) > (16u << 20)) bad(path, "is over 16 MiB; a config.json is a few hundred bytes");
  std::ifstream in(path, std::ios::binary);
  if (!in) bad(path, "cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

Overrides read_hf_config(const std::string& path, const std::string& model) {
  return read_hf_config_text(read_config_file(path), path, model);
}

std::string hf_model_type(const std::string& path) {
  const json j = parse_config(read_config_file(path), path);
  if (!j.contains("model_type") || j["model_type"].is_null()) return "";
  if (!j["model_type"].is_string()) bad(path, "model_type is " + j["model_type"].dump() + ", not a string");
  return j["model_type"].get<std::string>();
}

Overrides read_hf_config_text(const std::string& text, const std::string& path, const std::string& model) {
  if (model != "llama") bad(path, "a Hugging Face config describes the llama example only, not '" + model + "'");
  const json j = parse_config(text, path);
  Overrides out;
  try {
    refuse_unsupported(path, j);
    for (const Key& k : kLlamaKeys) {
      if (!j.contains(k.hf) || j[k.hf].is_null()) continue;
      const json& v = j[k.hf];
      if (k.integer ? !v.is_number_integer() : !v.is_number())
        bad(path, std::string(k.hf) + " is " + v.dump() + ", not " + (k.integer ? "an integer" : "a number"));
      // Unsigned values past int64 would read back negative.
      if (k.integer && (v.is_number_unsigned() ? v.get<unsigned long long>() > INT64_MAX : v.get<long long>() < 0))
        bad(path, std::string(k.hf) + " is " + v.dump() + ", not between 0 and " + std::to_string(INT64_MAX));
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
