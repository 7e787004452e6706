#include "models/hf_config.h"

#include <algorithm>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "models/hf_config_family.h"
#include "shardplan/error.h"

namespace shardplan {
namespace examples {
namespace {

using json = nlohmann::json;

// The config keys every Llama-like family shares and the example's (models/llama.h).
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
// Without these the family's default (4096 hidden units, 32000 words) would
// be built, which no small checkpoint is.
constexpr const char* kNeeded[] = {"vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers",
                                   "intermediate_size"};

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

bool is_set(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

void need(const json& j, const std::string& path, const char* key, const std::string& family) {
  if (!j.contains(key)) bad(path, std::string(key) + " is missing; a " + family + " config.json must give it");
}

// `k` into `out` when set: an integer between 0 and INT64_MAX, or a number.
void read_key(const json& j, const std::string& path, const Key& k, Overrides& out) {
  if (!is_set(j, k.hf)) return;
  const json& v = j[k.hf];
  if (k.integer ? !v.is_number_integer() : !v.is_number())
    bad(path, std::string(k.hf) + " is " + v.dump() + ", not " + (k.integer ? "an integer" : "a number"));
  // Unsigned values past int64 would read back negative.
  if (k.integer && (v.is_number_unsigned() ? v.get<unsigned long long>() > INT64_MAX : v.get<long long>() < 0))
    bad(path, std::string(k.hf) + " is " + v.dump() + ", not between 0 and " + std::to_string(INT64_MAX));
  out[k.ours] = k.integer ? std::to_string(v.get<long long>()) : number_text(v);
}

// What the example does not do must not be ignored: its weights would load
// and compute something else.
void refuse_rope_scaling(const std::string& path, const json& j) {
  if (is_set(j, "rope_scaling")) bad(path, "rope_scaling is set; the example's rotary embedding has no scaling");
}

void refuse_biases(const std::string& path, const json& j) {
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (j.contains(key) && j[key] != false) bad(path, std::string(key) + " is set; the example's layers have no biases");
}

void require_silu(const std::string& path, const json& j) {
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    bad(path, "hidden_act is " + j["hidden_act"].dump() + "; the example's MLP is SwiGLU (silu)");
}

// For the families whose modeling code takes the head size as
// hidden_size / num_attention_heads whatever head_dim says.
void refuse_other_head_dim(const std::string& path, const json& j) {
  if (is_set(j, "head_dim") && j.contains("hidden_size") && j.contains("num_attention_heads")) {
    // Sizes that are not whole int64 numbers are named by the key check
    // after this (get<long long> of 4e43 is undefined behaviour). Divided,
    // not multiplied: a head_dim near 2^63 would overflow.
    const auto hidden = int64_of(j["hidden_size"]), heads = int64_of(j["num_attention_heads"]);
    const auto head_dim = int64_of(j["head_dim"]);
    if (hidden && heads && (!head_dim || *heads <= 0 || *hidden % *heads != 0 || *head_dim != *hidden / *heads))
      bad(path, "head_dim " + j["head_dim"].dump() + " is not hidden_size / num_attention_heads; the example's is");
  }
}

// The keys every Llama-like family shares, after its own refusals.
Overrides read_common(const json& j, const std::string& path, const std::string& family, bool tie_default) {
  Overrides out;
  for (const Key& k : kLlamaKeys) read_key(j, path, k, out);
  for (const char* key : kNeeded) need(j, path, key, family);
  bool tie = tie_default;
  if (j.contains("tie_word_embeddings")) {
    if (!j["tie_word_embeddings"].is_boolean()) bad(path, "tie_word_embeddings is not true or false");
    tie = j["tie_word_embeddings"].get<bool>();
  }
  out["tie"] = tie ? "1" : "0";
  // Hugging Face's default: as many kv heads as heads.
  if (!out.count("kv_heads") && out.count("heads")) out["kv_heads"] = out["heads"];
  out["family"] = family;
  return out;
}

Overrides read_llama(const json& j, const std::string& path) {
  refuse_rope_scaling(path, j);
  refuse_biases(path, j);
  require_silu(path, j);
  refuse_other_head_dim(path, j);
  return read_common(j, path, "llama", false);
}

// Qwen2Attention: q, k and v with biases (always; config.json has no key
// for them), o_proj without.
Overrides read_qwen2(const json& j, const std::string& path) {
  refuse_rope_scaling(path, j);
  require_silu(path, j);
  refuse_other_head_dim(path, j);
  // sliding_window only counts with use_sliding_window, and then for some
  // layers only (max_window_layers, whose meaning changed between releases).
  if (j.contains("use_sliding_window") && j["use_sliding_window"] != false)
    bad(path, "use_sliding_window is set; the example gives qwen2 no window (max_window_layers picks layers)");
  return read_common(j, path, "qwen2", false);
}

// MistralAttention: sliding_window (null: none), head_dim when given.
Overrides read_mistral(const json& j, const std::string& path) {
  refuse_rope_scaling(path, j);
  refuse_biases(path, j);
  require_silu(path, j);
  // MistralConfig's default is 4096: a file without it is not the model its
  // writer meant, or one from before the key.
  need(j, path, "sliding_window", "mistral");
  Overrides out = read_common(j, path, "mistral", false);
  read_key(j, path, {"sliding_window", "window", true}, out);
  read_key(j, path, {"head_dim", "head_dim", true}, out);
  return out;
}

// GemmaForCausalLM (v1): head_dim always given; the MLP's activation is
// hidden_activation, or tanh GELU when that is null whatever hidden_act
// says (GemmaMLP since transformers 4.39); tied embeddings by default.
Overrides read_gemma(const json& j, const std::string& path) {
  refuse_rope_scaling(path, j);
  refuse_biases(path, j);
  if (is_set(j, "hidden_activation") && j["hidden_activation"] != "gelu_pytorch_tanh")
    bad(path, "hidden_activation is " + j["hidden_activation"].dump() +
                  "; the example's gemma MLP is GeGLU with tanh GELU (gelu_pytorch_tanh)");
  need(j, path, "head_dim", "gemma");
  Overrides out = read_common(j, path, "gemma", true);
  read_key(j, path, {"head_dim", "head_dim", true}, out);
  return out;
}

// Phi3: Llama's keys; its fused qkv_proj and gate_up_proj are the weights
// loader's (framework/src/weights).
Overrides read_phi3(const json& j, const std::string& path) {
  refuse_rope_scaling(path, j);
  refuse_biases(path, j);
  require_silu(path, j);
  refuse_other_head_dim(path, j);
  if (j.contains("partial_rotary_factor") && j["partial_rotary_factor"] != 1)
    bad(path, "partial_rotary_factor is " + j["partial_rotary_factor"].dump() +
                  "; the example rotates the whole head (1.0)");
  // Phi3Model masks with sliding_window as Mistral does (null: none).
  Overrides out = read_common(j, path, "phi3", false);
  read_key(j, path, {"sliding_window", "window", true}, out);
  return out;
}

json write_common(const Overrides& ours) {
  json j = json::object();
  for (const Key& k : kLlamaKeys) {
    const auto it = ours.find(k.ours);
    if (it == ours.end()) continue;
    if (k.integer)
      j[k.hf] = std::stoll(it->second);
    else
      j[k.hf] = std::stod(it->second);
  }
  j["tie_word_embeddings"] = ours.count("tie") && ours.at("tie") == "1";
  return j;
}

// A head_dim the example was given, or none (hidden_size / heads).
void write_head_dim(const Overrides& ours, json& j) {
  const auto it = ours.find("head_dim");
  if (it != ours.end() && it->second != "0") j["head_dim"] = std::stoll(it->second);
}

json write_llama(const Overrides& ours) {
  json j = write_common(ours);
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  return j;
}

json write_qwen2(const Overrides& ours) {
  json j = write_common(ours);
  j["hidden_act"] = "silu";
  j["use_sliding_window"] = false;
  return j;
}

json write_mistral(const Overrides& ours) {
  json j = write_common(ours);
  j["hidden_act"] = "silu";
  const auto it = ours.find("window");
  j["sliding_window"] = it == ours.end() || it->second == "0" ? json(nullptr) : json(std::stoll(it->second));
  write_head_dim(ours, j);
  return j;
}

json write_gemma(const Overrides& ours) {
  json j = write_common(ours);
  j["hidden_act"] = "gelu_pytorch_tanh";
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["attention_bias"] = false;
  write_head_dim(ours, j);
  if (!j.contains("head_dim") && ours.count("embed") && ours.count("heads"))
    j["head_dim"] = std::stoll(ours.at("embed")) / std::max(1LL, std::stoll(ours.at("heads")));
  return j;
}

json write_phi3(const Overrides& ours) {
  json j = write_common(ours);
  j["hidden_act"] = "silu";
  j["rope_scaling"] = nullptr;
  const auto it = ours.find("window");
  j["sliding_window"] = it == ours.end() || it->second == "0" ? json(nullptr) : json(std::stoll(it->second));
  return j;
}

struct Family {
  const char* type;          // config.json's model_type
  const char* architecture;  // its architectures[0]
  const char* example;       // the example model that computes it
  HfConfigReader read;
  HfConfigWriter write;
};
const Family kFamilies[] = {
    {"llama", "LlamaForCausalLM", "llama", read_llama, write_llama},
    {"qwen2", "Qwen2ForCausalLM", "llama", read_qwen2, write_qwen2},
    {"mistral", "MistralForCausalLM", "llama", read_mistral, write_mistral},
    {"gemma", "GemmaForCausalLM", "llama", read_gemma, write_gemma},
    {"phi3", "Phi3ForCausalLM", "llama", read_phi3, write_phi3},
    {"gpt2", "GPT2LMHeadModel", "gpt2", read_gpt2_config, gpt2_config_json},
};

const Family* family_named(const std::string& type) {
  for (const Family& f : kFamilies)
    if (type == f.type) return &f;
  return nullptr;
}

std::string known_types() {
  std::string s;
  for (const Family& f : kFamilies) s += (s.empty() ? "" : ", ") + std::string(f.type);
  return s;
}

bool is_example(const std::string& model) {
  for (const Family& f : kFamilies)
    if (model == f.example) return true;
  return false;
}

// config.json's family; one without model_type is read as `model`'s (a
// family's name, or the llama example's own).
const Family& family_of(const json& j, const std::string& path, const std::string& model) {
  if (!j.contains("model_type")) {
    const Family* f = family_named(model);
    if (!f) bad(path, "model_type is missing (known: " + known_types() + ")");
    return *f;
  }
  const json& t = j["model_type"];
  const Family* f = t.is_string() ? family_named(t.get<std::string>()) : nullptr;
  if (!f) bad(path, "model_type " + t.dump() + " is not one of the known: " + known_types());
  return *f;
}

// Nesting deeper than this is refused while parsing: a config is flat, and
// dump() of a deep value (for a message) would recurse once per level.
constexpr int kMaxJsonDepth = 32;

}  // namespace

json parse_hf_config(const std::string& text, const std::string& path) {
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

std::string find_hf_config(const std::string& weights_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(weights_path);
  const fs::path candidate = fs::is_directory(p, ec) ? p / "config.json" : p.parent_path() / "config.json";
  // One that is there but not a file is returned, for read_hf_config to refuse.
  return fs::exists(candidate, ec) ? candidate.string() : "";
}

std::string read_hf_config_file(const std::string& path) {
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

Overrides read_hf_config(const std::string& path, const std::string& model) {
  return read_hf_config_text(read_hf_config_file(path), path, model);
}

Overrides read_hf_config_text(const std::string& text, const std::string& path, const std::string& model) {
  if (!is_example(model) && !family_named(model))
    bad(path, "a Hugging Face config describes the examples llama and gpt2 only, not '" + model + "'");
  const json j = parse_hf_config(text, path);
  const Family& f = family_of(j, path, model);
  if (model != f.example && model != f.type)
    bad(path, "model_type '" + std::string(f.type) + "' is computed by model '" + f.example + "', not '" + model + "'");
  try {
    return f.read(j, path);
  } catch (const json::exception& e) {
    bad(path, e.what());
  }
}

std::vector<std::string> hf_model_types() {
  std::vector<std::string> out;
  for (const Family& f : kFamilies) out.push_back(f.type);
  return out;
}

std::string hf_example_for(const std::string& model_type) {
  const Family* f = family_named(model_type);
  return f ? f->example : "";
}

std::string hf_model_for_weights(const std::string& weights, const std::string& model, bool given) {
  const std::string path = weights.empty() ? "" : find_hf_config(weights);
  if (path.empty()) return model;
  // Read whole by read_hf_config later; here only its model_type, with the
  // same bounds (the file is refused there when it is no file at all).
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec) || fs::file_size(path, ec) > (16u << 20)) return model;
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  const json j = parse_hf_config(text.str(), path);
  const Family& f = family_of(j, path, "llama");
  if (given && model != f.example && model != f.type)
    bad(path, "model_type '" + std::string(f.type) + "' is computed by --model " + f.example + ", not --model " + model);
  return f.example;
}

std::string hf_config_json(const std::string& model, const std::string& config_str, const std::string& dtype) {
  Overrides ours;
  std::istringstream items(config_str);
  for (std::string item; items >> item;) {
    const auto eq = item.find('=');
    if (eq != std::string::npos) ours[item.substr(0, eq)] = item.substr(eq + 1);
  }
  const Family* f = nullptr;
  if (model == "llama") {
    f = family_named(ours.count("family") ? ours["family"] : "llama");
  } else {
    for (const Family& g : kFamilies)
      if (model == g.example) f = &g;
  }
  if (!f || f->example != model) return "";
  json j = f->write(ours);
  if (!j.is_object()) return "";
  j["architectures"] = {f->architecture};
  j["model_type"] = f->type;
  j["torch_dtype"] = dtype;
  return j.dump(2) + "\n";
}

}  // namespace examples
}  // namespace shardplan
