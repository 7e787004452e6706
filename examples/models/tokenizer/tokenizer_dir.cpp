// A checkpoint directory's tokenizer with its BOS/EOS settings (tokenizer.h's
// load_tokenizer): tokenizer_config.json and generation_config.json wrap the
// tokenizer file's own choice.
#include <filesystem>

#include "models/tokenizer/hf_tokenizer_parts.h"
#include "models/tokenizer/pretokenize.h"
#include "models/tokenizer/tokenizer.h"
#include "shardplan/error.h"

namespace shardplan {
namespace examples {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tokenizer_detail::read_json_object;

// Chat templates make tokenizer_config.json tens of KiB; far above that.
constexpr int64_t kMaxConfigBytes = int64_t{16} << 20;

[[noreturn]] void fail_config(const std::string& file, const std::string& what) {
  throw Error(tokenizer_detail::printable("tokenizer file '" + file + "': " + what));
}

struct Special {
  int add_bos = -1, add_eos = -1;  // -1: as the tokenizer file says
  int64_t bos = -1;
  std::vector<int64_t> eos;  // empty: the tokenizer file's
};

int64_t checked_id(const json& v, const Tokenizer& t, const std::string& file, const std::string& key) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= t.vocab_size())
    fail_config(file, key + " is not an id below the vocabulary's " + std::to_string(t.vocab_size()));
  return v.get<int64_t>();
}

// bos_token / eos_token: a string or {"content": string}, a token of the vocabulary.
int64_t token_id(const json& v, const Tokenizer& t, const std::string& file, const std::string& key) {
  const json* content = v.is_object() && v.contains("content") ? &v["content"] : &v;
  if (!content->is_string()) fail_config(file, key + " is not a token's text");
  const int64_t id = t.token_to_id(content->get<std::string>());
  if (id < 0) fail_config(file, key + " '" + content->get<std::string>().substr(0, 80) + "' is no token of the vocabulary");
  return id;
}

void read_tokenizer_config(const std::string& file, const Tokenizer& t, Special* s) {
  const json c = read_json_object(file, kMaxConfigBytes);
  for (const char* key : {"add_bos_token", "add_eos_token"}) {
    if (!c.contains(key) || c[key].is_null()) continue;
    if (!c[key].is_boolean()) fail_config(file, std::string(key) + " is not true or false");
    (std::string(key) == "add_bos_token" ? s->add_bos : s->add_eos) = c[key].get<bool>();
  }
  if (c.contains("bos_token") && !c["bos_token"].is_null()) s->bos = token_id(c["bos_token"], t, file, "bos_token");
  if (c.contains("eos_token") && !c["eos_token"].is_null()) s->eos = {token_id(c["eos_token"], t, file, "eos_token")};
}

void read_generation_config(const std::string& file, const Tokenizer& t, Special* s) {
  const json c = read_json_object(file, kMaxConfigBytes);
  if (c.contains("bos_token_id") && !c["bos_token_id"].is_null())
    s->bos = checked_id(c["bos_token_id"], t, file, "bos_token_id");
  if (!c.contains("eos_token_id") || c["eos_token_id"].is_null()) return;
  const json& eos = c["eos_token_id"];
  if (eos.is_array() && (eos.empty() || eos.size() > 64)) fail_config(file, "eos_token_id is not 1 to 64 ids");
  s->eos.clear();
  for (const json& id : eos.is_array() ? eos : json::array({eos}))
    s->eos.push_back(checked_id(id, t, file, "eos_token_id"));
}

class ConfiguredTokenizer : public Tokenizer {
 public:
  ConfiguredTokenizer(std::unique_ptr<Tokenizer> base, Special s) : base_(std::move(base)), s_(std::move(s)) {}

  std::vector<int64_t> encode(const std::string& text, bool add_special) const override {
    if (s_.add_bos < 0 && s_.add_eos < 0) return base_->encode(text, add_special);
    std::vector<int64_t> ids;
    if (add_special && s_.add_bos > 0 && bos_id() >= 0) ids.push_back(bos_id());
    const std::vector<int64_t> body = base_->encode(text, false);
    ids.insert(ids.end(), body.begin(), body.end());
    if (add_special && s_.add_eos > 0 && eos_id() >= 0) ids.push_back(eos_id());
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const override { return base_->decode(ids); }
  int64_t vocab_size() const override { return base_->vocab_size(); }
  int64_t token_to_id(const std::string& token) const override { return base_->token_to_id(token); }
  int64_t bos_id() const override { return s_.bos >= 0 ? s_.bos : base_->bos_id(); }
  int64_t eos_id() const override { return s_.eos.empty() ? base_->eos_id() : s_.eos[0]; }
  std::vector<int64_t> eos_ids() const override { return s_.eos.empty() ? base_->eos_ids() : s_.eos; }

 private:
  std::unique_ptr<Tokenizer> base_;
  Special s_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir) {
  const fs::path d(dir);
  std::unique_ptr<Tokenizer> base;
  std::error_code ec;
  if (fs::exists(d / "tokenizer.json", ec)) base = load_hf_tokenizer((d / "tokenizer.json").string());
  else if (fs::exists(d / "tokenizer.model", ec)) base = load_sentencepiece_tokenizer((d / "tokenizer.model").string());
  else throw Error("checkpoint directory '" + dir + "' has neither tokenizer.json nor tokenizer.model");
  Special s;
  if (fs::exists(d / "tokenizer_config.json", ec)) read_tokenizer_config((d / "tokenizer_config.json").string(), *base, &s);
  if (fs::exists(d / "generation_config.json", ec))
    read_generation_config((d / "generation_config.json").string(), *base, &s);
  return std::make_unique<ConfiguredTokenizer>(std::move(base), std::move(s));
}

}  // namespace examples
}  // namespace shardplan
