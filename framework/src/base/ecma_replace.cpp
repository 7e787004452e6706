// std::regex_replace's ECMAScript formats over RE2 matches (ecma_regex.h).
#include <re2/re2.h>

#include <algorithm>

#include "base/ecma_regex.h"

namespace shardplan::regex_detail {

EcmaFormat::EcmaFormat(const std::string& f, const EcmaRegex& re) {
  auto literal = [&](const std::string& s) {
    if (pieces_.empty() || pieces_.back().group != -1) pieces_.emplace_back();
    pieces_.back().text += s;
  };
  for (size_t i = 0; i < f.size();) {
    const char next = i + 1 < f.size() ? f[i + 1] : '\0';
    if (f[i] != '$' || i + 1 == f.size()) {
      literal(std::string(1, f[i++]));
    } else if (next == '$') {
      literal("$");
      i += 2;
    } else if (next == '&' || next == '`' || next == '\'') {
      pieces_.push_back({"", next == '&' ? 0 : next == '`' ? kBefore : kAfter});
      i += 2;
    } else if (next >= '0' && next <= '9') {
      // As libstdc++: one or two digits, whichever are there.
      int group = next - '0';
      i += 2;
      if (i < f.size() && f[i] >= '0' && f[i] <= '9') group = group * 10 + (f[i++] - '0');
      if (group > re.groups())
        throw RegexError("the replacement '" + f + "' uses $" + std::to_string(group) + " but the pattern has " +
                         std::to_string(re.groups()) + (re.groups() == 1 ? " group" : " groups"));
      pieces_.push_back({"", group});
    } else {
      literal("$");
      ++i;
    }
  }
}

std::string replace_all(const EcmaRegex& re, const std::string& text, const EcmaFormat& format, size_t max_matches,
                        size_t max_bytes) {
  const size_t limit = std::max(text.size(), max_bytes);
  std::vector<re2::StringPiece> m(static_cast<size_t>(re.groups()) + 1);
  std::string out;
  auto append = [&](const char* data, size_t n) {
    if (n > limit - out.size())
      throw RegexError("the result would be longer than " + std::to_string(limit) + " bytes");
    out.append(data, n);
  };
  size_t copied = 0;  // text[0, copied) is in `out`, as is or replaced
  size_t matches = 0;
  for (size_t from = 0; from <= text.size();) {
    if (!re.re2().Match(text, from, text.size(), re2::RE2::UNANCHORED, m.data(), static_cast<int>(m.size()))) break;
    // Each search may read the rest of the text: bounded, that is linear.
    if (++matches > max_matches)
      throw RegexError("it matches more than " + std::to_string(max_matches) + " times in one name");
    const size_t start = static_cast<size_t>(m[0].data() - text.data()), end = start + m[0].size();
    append(text.data() + copied, start - copied);
    for (const auto& piece : format.pieces()) {
      if (piece.group == -1) {
        append(piece.text.data(), piece.text.size());
      } else if (piece.group == EcmaFormat::kBefore) {
        append(text.data(), start);
      } else if (piece.group == EcmaFormat::kAfter) {
        append(text.data() + end, text.size() - end);
      } else {
        const auto& g = m[static_cast<size_t>(piece.group)];
        if (g.data()) append(g.data(), g.size());
      }
    }
    copied = end;
    // After an empty match the next one starts a character later, as
    // std::regex_iterator's does (that character is copied as it is).
    from = end > start ? end : end + 1;
  }
  append(text.data() + copied, text.size() - copied);
  return out;
}

}  // namespace shardplan::regex_detail
