#pragma once
// tokenizer.json read and checked (hf_tokenizer_parts.cpp) into what
// hf_tokenizer.cpp's encoder runs.
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/tokenizer/pretokenize.h"

namespace shardplan {
namespace examples {
namespace tokenizer_detail {

// Bounds on untrusted files, far above the largest published vocabularies
// (Gemma's 256k tokens, Llama 3's 9 MiB file).
constexpr int64_t kMaxFileBytes = int64_t{512} << 20;
constexpr int64_t kMaxVocab = int64_t{1} << 22;
constexpr size_t kMaxTokenBytes = 4096;
constexpr int kMaxJsonDepth = 16;

struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = false;
};

struct Merge {
  int64_t rank = 0;
  int64_t id = 0;  // the merged token's
};

inline uint64_t pair_key(int64_t a, int64_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b); }

struct HfParts {
  std::string file;
  std::unordered_map<std::string, int64_t> vocab;  // added tokens included
  std::vector<std::string> id_to_token;            // "" where no token has the id
  std::vector<char> is_added;
  std::unordered_map<uint64_t, Merge> merges;
  std::vector<AddedToken> added;
  std::vector<std::unique_ptr<RegexSplitter>> splitters;  // applied in order
  bool add_prefix_space = false;
  bool ignore_merges = false;
  int64_t byte_ids[256] = {};
  std::vector<int64_t> prefix, suffix;  // the post-processor's around one sequence
  int64_t bos = -1, eos = -1;
};

HfParts read_hf_parts(const std::string& path);
// The same from the file's text (the fuzzer's entry); `path` names it in errors.
HfParts read_hf_parts_text(const std::string& text, const std::string& path);

// A JSON object from an untrusted file: at most max_bytes, nesting bounded;
// else an error naming the file ("tokenizer file '...': ...").
nlohmann::json read_json_object(const std::string& path, int64_t max_bytes);

}  // namespace tokenizer_detail
}  // namespace examples
}  // namespace shardplan
