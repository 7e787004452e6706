// tokenizer.json's normalizers, Metaspace pre-tokenizer and decoders
// (hf_tokenizer_parts.h), as Hugging Face's tokenizers runs them: the
// normalizers on each piece of the text between added tokens, then
// Metaspace; the decoders over the list of token strings, each step on the
// output of the one before.
#include <algorithm>

#include "models/tokenizer/hf_tokenizer_parts.h"
#include "shardplan/error.h"

#if defined(SHARDPLAN_HAVE_ICU)
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#endif

namespace shardplan {
namespace examples {
namespace tokenizer_detail {

namespace {

void replace_all(std::string* s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (size_t at = s->find(from); at != std::string::npos; at = s->find(from, at + to.size()))
    s->replace(at, from.size(), to);
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// "<0xNN>" (either case of hex digit, as Rust's from_str_radix reads it): the byte, else -1.
int fallback_byte(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = token[k];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

// Consecutive byte tokens become their text where it is UTF-8, else one
// U+FFFD per byte.
std::vector<std::string> byte_fallback(const std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string bytes;
  const auto flush = [&] {
    if (bytes.empty()) return;
    if (valid_utf8(bytes)) out.push_back(bytes);
    else
      for (size_t k = 0; k < bytes.size(); ++k) out.push_back("\xEF\xBF\xBD");
    bytes.clear();
  };
  for (const std::string& t : tokens) {
    const int b = fallback_byte(t);
    if (b >= 0) {
      bytes += static_cast<char>(b);
      continue;
    }
    flush();
    out.push_back(t);
  }
  flush();
  return out;
}

std::string strip(const std::string& token, const std::string& content, int64_t start, int64_t stop) {
  size_t begin = 0, end = token.size();
  for (int64_t k = 0; k < start && !content.empty() && token.compare(begin, content.size(), content) == 0; ++k)
    begin += content.size();
  for (int64_t k = 0; k < stop && !content.empty() && end >= begin + content.size() &&
                      token.compare(end - content.size(), content.size(), content) == 0;
       ++k)
    end -= content.size();
  return token.substr(begin, end - begin);
}

}  // namespace

std::string nfc(const std::string& text, const std::string& file) {
#if defined(SHARDPLAN_HAVE_ICU)
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) throw Error("tokenizer '" + file + "': ICU has no NFC normalizer");
  const icu::UnicodeString out = n->normalize(icu::UnicodeString::fromUTF8(text), status);
  if (U_FAILURE(status)) throw Error("tokenizer '" + file + "': ICU could not normalize the text to NFC");
  std::string s;
  return out.toUTF8String(s);
#else
  (void)text;
  throw Error("tokenizer file '" + file + "': normalizer NFC needs ICU, and this build has none (install libicu-dev)");
#endif
}

std::vector<std::string> metaspace_words(const HfParts& p, std::string s, bool at_start) {
  for (const Normalizer& n : p.normalizers) {
    if (n.kind == Normalizer::kPrepend && !s.empty()) s.insert(0, n.text);
    if (n.kind == Normalizer::kReplace) replace_all(&s, n.text, n.content);
  }
  if (!p.has_metaspace) return {s};
  const Metaspace& m = p.metaspace;
  replace_all(&s, " ", m.replacement);
  const bool prepend = m.prepend == Metaspace::kAlways || (m.prepend == Metaspace::kFirst && at_start);
  if (prepend && !starts_with(s, m.replacement)) s.insert(0, m.replacement);
  if (!m.split) return {s};
  // Split on the replacement, each one beginning the word after it.
  std::vector<std::string> words;
  size_t begin = 0;
  for (size_t at = s.find(m.replacement, 1); at != std::string::npos; at = s.find(m.replacement, at + 1)) {
    words.push_back(s.substr(begin, at - begin));
    begin = at;
  }
  words.push_back(s.substr(begin));
  words.erase(std::remove(words.begin(), words.end(), std::string()), words.end());
  return words;
}

std::string run_decoders(const HfParts& p, std::vector<std::string> tokens) {
  for (const Decoder& d : p.decoders) {
    switch (d.kind) {
      case Decoder::kReplace:
        for (std::string& t : tokens) replace_all(&t, d.text, d.content);
        break;
      case Decoder::kByteFallback:
        tokens = byte_fallback(tokens);
        break;
      case Decoder::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens = {all};
        break;
      }
      case Decoder::kStrip:
        for (std::string& t : tokens) t = strip(t, d.content, d.start, d.stop);
        break;
      case Decoder::kMetaspace:  // the first token loses every replacement, as tokenizers' decoder does
        for (size_t i = 0; i < tokens.size(); ++i)
          replace_all(&tokens[i], d.text, i == 0 && d.prepend != Metaspace::kNever ? "" : " ");
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace tokenizer_detail
}  // namespace examples
}  // namespace shardplan
