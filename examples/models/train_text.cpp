#include "models/train_text.h"

#include <ATen/ATen.h>

#include <filesystem>

#include "models/generate.h"
#include "models/hf_config.h"
#include "models/tokenizer/tokenizer.h"
#include "shardplan/error.h"

namespace shardplan {
namespace examples {
namespace {

namespace fs = std::filesystem;

// The directory --load-weights names, or the one its file is in.
std::string weights_dir(const std::string& weights) {
  std::error_code ec;
  const fs::path p(weights);
  return fs::is_directory(p, ec) ? p.string() : p.parent_path().string();
}

// The file load_tokenizer reads in `dir`, or "".
std::string tokenizer_file(const std::string& dir) {
  std::error_code ec;
  for (const char* name : {"tokenizer.json", "tokenizer.model"})
    if (fs::exists(fs::path(dir) / name, ec)) return (fs::path(dir) / name).string();
  return "";
}

// Where the model's vocabulary came from, for the mismatch's message.
std::string vocab_source(const Args& a, int64_t vocab) {
  const std::string v = std::to_string(vocab);
  if (a.config.find("vocab=") != std::string::npos) return "the model's vocab=" + v + " (--config)";
  const std::string config = a.load_weights.empty() ? "" : find_hf_config(a.load_weights);
  if (!config.empty()) return "config.json '" + config + "' vocab_size " + v;
  return "the model's vocabulary of " + v;
}

}  // namespace

void load_prompt_tokenizer(Args& a, int64_t model_vocab) {
  if (a.generate == 0 && a.dump_logits.empty()) return;
  std::string dir = a.tokenizer_dir;
  if (dir.empty() && !a.load_weights.empty()) {
    const std::string d = weights_dir(a.load_weights);
    if (!d.empty() && !tokenizer_file(d).empty()) dir = d;
  }
  if (dir.empty()) return;
  a.tokenizer = load_tokenizer(dir);
  const int64_t size = a.tokenizer->vocab_size();
  if (size > model_vocab)
    throw Error("tokenizer '" + tokenizer_file(dir) + "' has ids up to " + std::to_string(size - 1) + " (" +
                std::to_string(size) + " tokens), more than " + vocab_source(a, model_vocab) +
                " (the embedding has no rows for the rest)");
}

at::Tensor prompt_tokens(const Args& a) {
  if (!a.tokenizer) return encode(a.prompt);
  const std::vector<int64_t> ids = a.tokenizer->encode(a.prompt, /*add_special=*/true);
  return at::tensor(ids, at::kLong).reshape({1, static_cast<int64_t>(ids.size())});
}

int64_t prompt_length(const Args& a) {
  return a.tokenizer ? static_cast<int64_t>(a.tokenizer->encode(a.prompt, true).size())
                     : static_cast<int64_t>(a.prompt.size());
}

std::vector<int64_t> stop_ids(const Args& a) { return a.tokenizer ? a.tokenizer->eos_ids() : std::vector<int64_t>{}; }

std::string sample_text(const Args& a, const at::Tensor& row, bool* stopped, int64_t* length) {
  *length = sample_length(row, stop_ids(a), stopped);
  const at::Tensor ids = row.reshape(-1).narrow(0, 0, *length).to(at::kLong).contiguous();
  if (!a.tokenizer) return printable(decode(ids));
  const int64_t* p = ids.data_ptr<int64_t>();
  return printable_utf8(a.tokenizer->decode(std::vector<int64_t>(p, p + ids.numel())));
}

}  // namespace examples
}  // namespace shardplan
