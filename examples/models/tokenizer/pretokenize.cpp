// UTF-8, GPT-2's byte map and the regex pre-tokenizer (pretokenize.h).
#include "models/tokenizer/pretokenize.h"

#include <re2/re2.h>

#include "shardplan/error.h"

namespace shardplan {
namespace examples {
namespace tokenizer_detail {

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

int32_t next_code_point(const std::string& s, size_t* pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = byte(*pos);
  int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
  if (n < 0 || *pos + n >= s.size()) {
    ++*pos;
    return -1;
  }
  int32_t cp = n == 0 ? c : c & (0x3f >> n);
  for (int k = 1; k <= n; ++k) {
    const unsigned char d = byte(*pos + k);
    if ((d >> 6) != 2) {
      ++*pos;
      return -1;
    }
    cp = (cp << 6) | (d & 0x3f);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
  static const int32_t kMin[] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || (cp >= 0xd800 && cp < 0xe000) || cp > 0x10ffff) {
    ++*pos;
    return -1;
  }
  *pos += n + 1;
  return cp;
}

void append_utf8(std::string* out, int32_t cp) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xc0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xe0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    *out += static_cast<char>(0xf0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

bool valid_utf8(const std::string& s) {
  for (size_t pos = 0; pos < s.size();)
    if (next_code_point(s, &pos) < 0) return false;
  return true;
}

std::string printable(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) out += std::string("\\x") + hex[c >> 4] + hex[c & 15];
    else out += static_cast<char>(c);
  }
  return out;
}

namespace {

// Bytes that print stand for themselves; the others, in order, for 256, 257, ...
std::vector<int32_t> byte_code_points() {
  std::vector<int32_t> cps(256);
  int32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool prints = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    cps[b] = prints ? b : next++;
  }
  return cps;
}

// Unicode's White_Space, which is Oniguruma's \s.
bool is_white_space(int32_t cp) {
  return (cp >= 0x9 && cp <= 0xd) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
         cp == 0x3000;
}

[[noreturn]] void fail_pattern(const std::string& file, const std::string& pattern, const std::string& what) {
  throw Error(printable("tokenizer file '" + file + "': pre-tokenizer pattern " + pattern.substr(0, 200) + ": " + what));
}

const char* const kLookahead = R"(|\s+(?!\S)|\s+)";

// The pattern in RE2's syntax: the trailing lookahead as group 1, \s as
// White_Space. Escapes and character classes are followed so that "\\s" and
// "[(]" are not mistaken.
std::string translate(const std::string& pattern, const std::string& file, bool* lookahead_group) {
  std::string body = pattern;
  const std::string tail = kLookahead;
  *lookahead_group = body.size() > tail.size() && body.compare(body.size() - tail.size(), tail.size(), tail) == 0;
  if (*lookahead_group) body.resize(body.size() - tail.size());
  std::string out;
  bool in_class = false;
  int depth = 0;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c == '\\' && i + 1 < body.size()) {
      const char e = body[++i];
      if (e == 's') out += in_class ? R"(\x{9}-\x{d}\x{85}\p{Z})" : R"([\x{9}-\x{d}\x{85}\p{Z}])";
      else if (e == 'S') fail_pattern(file, pattern, "\\S is supported only in a trailing \\s+(?!\\S)|\\s+");
      else out += std::string("\\") + e;
      continue;
    }
    if (in_class) {
      in_class = c != ']';
    } else if (c == '[') {
      in_class = true;
      if (i + 1 < body.size() && body[i + 1] == ']') out += body[i++];  // "[]...]" has ']' as its first member
    } else if (c == '(') {
      if (i + 1 >= body.size() || body[i + 1] != '?')
        fail_pattern(file, pattern, "capturing groups are not supported (write (?:...))");
      if (i + 2 < body.size() && (body[i + 2] == '=' || body[i + 2] == '!' || body[i + 2] == '<'))
        fail_pattern(file, pattern, "lookaround is supported only in a trailing \\s+(?!\\S)|\\s+ (RE2 has none)");
      ++depth;
    } else if (c == ')') {
      --depth;
    }
    out += c;
  }
  if (*lookahead_group) {
    if (depth != 0) fail_pattern(file, pattern, "unbalanced parentheses");
    out += R"(|([\x{9}-\x{d}\x{85}\p{Z}]+))";
  }
  return out;
}

}  // namespace

const std::vector<std::string>& byte_to_char() {
  static const std::vector<std::string> chars = [] {
    std::vector<std::string> out(256);
    const std::vector<int32_t> cps = byte_code_points();
    for (int b = 0; b < 256; ++b) append_utf8(&out[b], cps[b]);
    return out;
  }();
  return chars;
}

int byte_of_char(int32_t cp) {
  static const std::vector<int> inverse = [] {
    std::vector<int> out(512, -1);
    const std::vector<int32_t> cps = byte_code_points();
    for (int b = 0; b < 256; ++b) out[cps[b]] = b;
    return out;
  }();
  return cp >= 0 && cp < static_cast<int32_t>(inverse.size()) ? inverse[cp] : -1;
}

RegexSplitter::RegexSplitter(const std::string& pattern, const std::string& file) {
  const std::string translated = translate(pattern, file, &lookahead_group_);
  RE2::Options options;
  options.set_log_errors(false);
  re_ = std::make_unique<RE2>(translated, options);
  if (!re_->ok()) fail_pattern(file, pattern, "RE2 cannot run it (" + re_->error() + ")");
  if (re_->NumberOfCapturingGroups() != (lookahead_group_ ? 1 : 0))
    fail_pattern(file, pattern, "capturing groups are not supported (write (?:...))");
}

RegexSplitter::~RegexSplitter() = default;

std::vector<std::string> RegexSplitter::split(const std::string& text) const {
  std::vector<std::string> pieces;
  re2::StringPiece groups[2];
  size_t pos = 0;  // where the next search starts
  size_t gap = 0;  // where the text not yet in a piece starts
  while (pos < text.size() && re_->Match(text, pos, text.size(), RE2::UNANCHORED, groups, lookahead_group_ ? 2 : 1)) {
    size_t start = groups[0].data() - text.data();
    size_t end = start + groups[0].size();
    if (end == start) {  // an empty match is no piece; search on past one character
      pos = start;
      next_code_point(text, &pos);
      continue;
    }
    if (lookahead_group_ && groups[1].data() != nullptr && end < text.size()) {
      // \s+(?!\S) backtracks one character off a run a non-space follows;
      // a run of one then fails it and the \s+ after it takes that one.
      size_t after = end;
      if (!is_white_space(next_code_point(text, &after))) {
        size_t last = start, cur = start, count = 0;
        while (cur < end) {
          last = cur;
          next_code_point(text, &cur);
          ++count;
        }
        if (count > 1) end = last;
      }
    }
    if (start > gap) pieces.push_back(text.substr(gap, start - gap));
    pieces.push_back(text.substr(start, end - start));
    gap = pos = end;
  }
  if (gap < text.size()) pieces.push_back(text.substr(gap));
  return pieces;
}

}  // namespace tokenizer_detail
}  // namespace examples
}  // namespace shardplan
