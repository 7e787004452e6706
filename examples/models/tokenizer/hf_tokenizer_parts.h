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

// tokenizer.json's text steps around a BPE that is not byte-level (Llama
// 2's and Mistral's, SentencePiece's "▁" for spaces and byte fallback
// "<0xNN>" tokens), and the NFC normalizer (Qwen2's), applied by
// hf_text_steps.cpp as Hugging Face's tokenizers applies them.
struct Normalizer {
  enum Kind { kPrepend, kReplace } kind;
  std::string text, content;  // Prepend: text; Replace: every `text` by `content`
};
struct Metaspace {  // the pre-tokenizer
  std::string replacement;  // "▁"
  enum Prepend { kAlways, kFirst, kNever } prepend = kAlways;
  bool split = true;
};
struct Decoder {
  enum Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  std::string text, content;  // Replace: as Normalizer; Strip: content; Metaspace: text (the replacement)
  int64_t start = 0, stop = 0;  // Strip: at most so many `content` off each token's start and end
  Metaspace::Prepend prepend = Metaspace::kAlways;
};

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
  // Not byte-level: each character is a token of its own where the vocab
  // has it, else its UTF-8 bytes' "<0xNN>" tokens (byte_fallback), else
  // unk (consecutive ones fused with fuse_unk), else nothing (as Hugging
  // Face drops it).
  bool byte_level = true;
  bool nfc = false;
  std::vector<Normalizer> normalizers;  // after NFC, in order
  bool has_metaspace = false;
  Metaspace metaspace;
  std::vector<Decoder> decoders;  // not byte-level; in order
  bool byte_fallback = false, fuse_unk = false;
  int64_t unk = -1;
  int64_t fallback_ids[256] = {};  // the "<0xNN>" tokens' ids, -1 where missing
};

// NFC by ICU (throws naming `file` in a build without it).
std::string nfc(const std::string& text, const std::string& file);
// A segment of the text between added tokens through the normalizers and
// the Metaspace pre-tokenizer: its words. `at_start`: the segment begins the
// text (Metaspace's prepend_scheme first).
std::vector<std::string> metaspace_words(const HfParts& p, std::string segment, bool at_start);
// The token strings of a decode through the decoders, joined.
std::string run_decoders(const HfParts& p, std::vector<std::string> tokens);

HfParts read_hf_parts(const std::string& path);
// The same from the file's text (the fuzzer's entry); `path` names it in errors.
HfParts read_hf_parts_text(const std::string& text, const std::string& path);

// A JSON object from an untrusted file: at most max_bytes, nesting bounded;
// else an error naming the file ("tokenizer file '...': ...").
nlohmann::json read_json_object(const std::string& path, int64_t max_bytes);

}  // namespace tokenizer_detail
}  // namespace examples
}  // namespace shardplan
