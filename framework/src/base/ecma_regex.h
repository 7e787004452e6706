// Regular expressions over names read from files (plan patterns, weight
// renames, names in TorchScript and Keras files). Users write the ECMAScript
// dialect of std::regex; RE2 runs it, in time linear in the text, with
// memory bounded by the pattern and no recursion on either (std::regex
// recursed once per character: a 300,000-character name overflowed the
// stack). Each pattern is translated construct by construct to RE2's syntax,
// so every difference between the dialects is decided here; what RE2 cannot
// run in linear time (back-references, lookahead) is refused naming its
// column in the pattern.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace re2 {
class RE2;
}

namespace shardplan::regex_detail {

// Longer patterns are refused: nothing that names parameters needs them,
// and a compiled pattern's memory grows with its length.
constexpr size_t kMaxPatternLength = 4096;
// RE2's own ceiling for one {m,n} (and for nested counts multiplied).
constexpr size_t kMaxRepeat = 1000;

// Why a pattern or replacement is refused: one phrase, no location.
class RegexError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A pattern or name as messages quote it, shortened: one may be megabytes.
std::string shown(const std::string& text);

// A pattern in RE2's syntax (Latin-1: byte for byte, as std::regex reads a
// std::string), with the literal text every full match starts and ends
// with: most names a plan's rule is tried on fail those string compares,
// several times faster than a call into RE2.
struct Translated {
  std::string syntax;
  std::string prefix, suffix;
  bool literal = false;  // the pattern is exactly `prefix`
};
// Throws RegexError.
Translated translate(const std::string& ecmascript);

class EcmaRegex {
 public:
  // Throws RegexError; `max_mem` bounds the compiled form and its caches.
  EcmaRegex(const std::string& pattern, int64_t max_mem);
  ~EcmaRegex();
  EcmaRegex(const EcmaRegex&) = delete;
  EcmaRegex& operator=(const EcmaRegex&) = delete;

  // As std::regex_match: the whole text.
  bool full_match(const std::string& text) const;
  // As std::regex_match with groups: false, or true and groups[i] the i-th
  // group's text ("" where it took no part).
  bool full_match(const std::string& text, std::vector<std::string>* groups) const;
  int groups() const;
  const re2::RE2& re2() const { return *re_; }

 private:
  std::unique_ptr<re2::RE2> re_;
  Translated guard_;  // its prefix, suffix and whether it is only that
};

// A std::regex_replace format (ECMAScript: $1 to $99, $& and $0 the match,
// $` and $' the text before and after it, $$ a '$'), parsed once. Throws
// RegexError for a group `re` lacks (std::regex would put nothing there).
class EcmaFormat {
 public:
  EcmaFormat(const std::string& format, const EcmaRegex& re);

  struct Piece {
    std::string text;  // literal, when group < 0
    int group = -1;    // 0..n: that group; kBefore/kAfter: $` and $'
  };
  static constexpr int kBefore = -2, kAfter = -3;
  const std::vector<Piece>& pieces() const { return pieces_; }

 private:
  std::vector<Piece> pieces_;
};

// Each match of `re` in `text` replaced by `format`, left to right, as
// std::regex_replace does. Bounded: each match costs at most one scan of the
// rest of the text, so more than `max_matches` matches, or a result longer
// than max(text, `max_bytes`), is a RegexError rather than quadratic time
// or unbounded memory.
std::string replace_all(const EcmaRegex& re, const std::string& text, const EcmaFormat& format, size_t max_matches,
                        size_t max_bytes);

}  // namespace shardplan::regex_detail
