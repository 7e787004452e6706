#pragma once
// Pieces of tokenizer.json's byte-level BPE (hf_tokenizer.cpp): UTF-8, the
// byte-to-character map of GPT-2's ByteLevel, and the regex pre-tokenizer.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace re2 {
class RE2;
}

namespace shardplan {
namespace examples {
namespace tokenizer_detail {

// The code point at s[*pos], advancing *pos; -1 (and *pos past the bad byte)
// where s is not UTF-8 there.
int32_t next_code_point(const std::string& s, size_t* pos);
void append_utf8(std::string* out, int32_t cp);
bool valid_utf8(const std::string& s);

// Text for a one-line message: control bytes as \xNN (a file's tokens and
// patterns may hold newlines).
std::string printable(const std::string& s);

// GPT-2's bytes_to_unicode: each byte as a printable character, as UTF-8.
const std::vector<std::string>& byte_to_char();
// The inverse, by code point (-1 where a code point is no byte's).
int byte_of_char(int32_t cp);

// Hugging Face's GPT-2 pre-tokenizer pattern (ByteLevel with use_regex).
extern const char* const kGpt2Pattern;

// A Split pre-tokenizer's pattern (Oniguruma syntax in tokenizer.json) run by
// RE2, which has no lookahead: the one lookahead these patterns use,
// "\s+(?!\S)|\s+", is run as "(\s+)" and the match shortened by its last
// character when more than one and a non-space follows (what backtracking
// into the lookahead does). \s is Unicode's White_Space, as in Oniguruma
// (RE2's \s is ASCII only). Anything else RE2 cannot run is an error naming
// the file.
class RegexSplitter {
 public:
  RegexSplitter(const std::string& pattern, const std::string& file);
  ~RegexSplitter();
  // The matches and the text between them, in order ("Isolated").
  std::vector<std::string> split(const std::string& text) const;

 private:
  std::unique_ptr<re2::RE2> re_;
  bool lookahead_group_ = false;
};

}  // namespace tokenizer_detail
}  // namespace examples
}  // namespace shardplan
