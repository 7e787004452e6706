#include "models/hf_config_gpt2.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <sstream>

#include "models/hf_config_family.h"
#include "shardplan/error.h"

namespace shardplan {
namespace examples {
namespace {

using json = nlohmann::json;

[[noreturn]] void bad_gpt2(const std::string& path, const std::string& why) { throw Error(path + ": " + why); }

// GPT2Config's keys and the example's; the first five have no default we
// would guess: a file without one is refused.
struct GPT2Key {
  const char* hf;
  const char* ours;
  bool required;
};
constexpr GPT2Key kSizes[] = {{"n_embd", "embed", true},       {"n_layer", "layers", true},
                          {"n_head", "heads", true},       {"n_positions", "context", true},
                          {"vocab_size", "vocab", true},   {"n_inner", "mlp", false}};

// What the example does not compute must not be ignored: the weights would
// load and compute something else.
void refuse_gpt2_unsupported(const std::string& path, const json& j) {
  if (j.contains("model_type") && j["model_type"] != "gpt2")
    bad_gpt2(path, "model_type is " + j["model_type"].dump() + ", not \"gpt2\"");
  if (j.contains("activation_function") && j["activation_function"] != "gelu_new")
    bad_gpt2(path, "activation_function is " + j["activation_function"].dump() +
                  "; the example's MLP is gelu_new (tanh approximation)");
  const std::pair<const char*, bool> flags[] = {{"scale_attn_weights", true},
                                                {"tie_word_embeddings", true},
                                                {"scale_attn_by_inverse_layer_idx", false},
                                                {"reorder_and_upcast_attn", false},
                                                {"add_cross_attention", false}};
  for (const auto& [key, want] : flags) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (!j[key].is_boolean()) bad_gpt2(path, std::string(key) + " is " + j[key].dump() + ", not true or false");
    if (j[key].get<bool>() != want)
      bad_gpt2(path, std::string(key) + " is " + (want ? "false" : "true") + "; the example's GPT-2 computes " + key + "=" +
                    (want ? "true" : "false"));
  }
}

}  // namespace

Overrides read_gpt2_config(const std::string& path) {
  return read_gpt2_config_text(read_hf_config_file(path), path);
}

Overrides read_gpt2_config_text(const std::string& text, const std::string& path) {
  return read_gpt2_config(parse_hf_config(text, path), path);
}

// models/hf_config.cpp's table row for model_type gpt2.
Overrides read_gpt2_config(const json& j, const std::string& path) {
  Overrides out;
  try {
    refuse_gpt2_unsupported(path, j);
    for (const GPT2Key& k : kSizes) {
      if (!j.contains(k.hf) || j[k.hf].is_null()) {
        if (k.required) bad_gpt2(path, std::string("lacks ") + k.hf + ", which GPT-2 needs");
        continue;
      }
      const json& v = j[k.hf];
      // nlohmann reads 0 and up as unsigned, which past INT64_MAX would read back negative.
      if (!v.is_number_integer() || (v.is_number_unsigned() ? v.get<unsigned long long>() - 1 >= INT64_MAX
                                                            : v.get<long long>() < 1))
        bad_gpt2(path, std::string(k.hf) + " is " + v.dump() + ", not an integer between 1 and " + std::to_string(INT64_MAX));
      out[k.ours] = std::to_string(v.get<long long>());
    }
    if (j.contains("layer_norm_epsilon") && !j["layer_norm_epsilon"].is_null()) {
      const json& v = j["layer_norm_epsilon"];
      if (!v.is_number() || !(v.get<double>() > 0)) bad_gpt2(path, "layer_norm_epsilon is " + v.dump() + ", not a positive number");
      std::ostringstream s;
      s.precision(17);
      s << v.get<double>();
      out["ln_eps"] = s.str();
    }
  } catch (const json::exception& e) {
    bad_gpt2(path, e.what());
  }
  // GPT2Config's default: n_inner null is 4 * n_embd (std::stoll is safe:
  // embed was checked to be a positive int64; 4x may not fit).
  if (!out.count("mlp")) {
    const long long e = std::stoll(out["embed"]);
    if (e > INT64_MAX / 4) bad_gpt2(path, "n_embd " + out["embed"] + " is too large for n_inner = 4 * n_embd");
    out["mlp"] = std::to_string(4 * e);
  }
  return out;
}

std::string gpt2_config_json(const std::string& config_str, const std::string& dtype) {
  Overrides ours;
  std::istringstream items(config_str);
  for (std::string item; items >> item;) {
    const auto eq = item.find('=');
    if (eq != std::string::npos) ours[item.substr(0, eq)] = item.substr(eq + 1);
  }
  json j = gpt2_config_json(ours);
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["torch_dtype"] = dtype;
  return j.dump(2) + "\n";
}

// models/hf_config.cpp's table row for model_type gpt2 (the caller adds
// architectures, model_type and torch_dtype).
json gpt2_config_json(const Overrides& given) {
  Overrides ours = given;
  json j = {{"activation_function", "gelu_new"}, {"scale_attn_weights", true}, {"tie_word_embeddings", true}};
  for (const GPT2Key& k : kSizes)
    if (ours.count(k.ours)) j[k.hf] = std::stoll(ours[k.ours]);
  if (ours.count("context")) j["n_ctx"] = std::stoll(ours["context"]);
  if (ours.count("ln_eps")) j["layer_norm_epsilon"] = std::stod(ours["ln_eps"]);
  return j;
}

GPT2FileLayout gpt2_file_layout() {
  // Hugging Face's GPT2Model files name tensors from "h.", "wte." ...;
  // GPT2LMHeadModel's from "transformer.". Both load.
  const std::string conv1d = R"(h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight)";
  return {{{R"(^(wte|wpe|h|ln_f)\.)", "transformer.$&"}},
          {"(transformer\\.)?" + conv1d},
          {"transformer\\." + conv1d}};
}

}  // namespace examples
}  // namespace shardplan
