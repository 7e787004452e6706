#include "base/ecma_regex.h"

#include <re2/re2.h>

#include <algorithm>
#include <bitset>
#include <cstring>

namespace shardplan::regex_detail {
namespace {

using Set = std::bitset<256>;
constexpr size_t kNone = static_cast<size_t>(-1);

[[noreturn]] void refuse(const std::string& why) { throw RegexError(why); }

std::string column(size_t i) { return "at column " + std::to_string(i + 1) + " of the pattern"; }

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_xdigit(char c) { return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); }

// A run of digits as messages show it: a refused one may be very long.
std::string shortened(const std::string& digits) {
  return digits.size() <= 20 ? digits : digits.substr(0, 20) + "...";
}

// What std::regex_traits<char> gives the class names in the classic locale
// (std::regex's default): ASCII only, so \W and [^...] take bytes >= 0x80.
bool named_class(const std::string& name, Set* out) {
  static const char* const kNames[] = {"d", "w", "s", "alnum", "alpha", "blank", "cntrl", "digit",
                                       "graph", "lower", "print", "punct", "space", "upper", "xdigit"};
  if (std::find_if(std::begin(kNames), std::end(kNames), [&](const char* n) { return name == n; }) ==
      std::end(kNames))
    return false;
  for (int c = 0; c < 128; ++c) {
    const bool digit = c >= '0' && c <= '9', upper = c >= 'A' && c <= 'Z', lower = c >= 'a' && c <= 'z';
    const bool alpha = upper || lower, graph = c > 32 && c < 127;
    bool in = false;
    if (name == "d" || name == "digit") in = digit;
    else if (name == "w") in = alpha || digit || c == '_';
    else if (name == "s" || name == "space") in = c == ' ' || (c >= 9 && c <= 13);
    else if (name == "alnum") in = alpha || digit;
    else if (name == "alpha") in = alpha;
    else if (name == "blank") in = c == ' ' || c == '\t';
    else if (name == "cntrl") in = c < 32 || c == 127;
    else if (name == "graph") in = graph;
    else if (name == "lower") in = lower;
    else if (name == "print") in = graph || c == ' ';
    else if (name == "punct") in = graph && !alpha && !digit;
    else if (name == "upper") in = upper;
    else in = digit || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
    out->set(static_cast<size_t>(c), in);
  }
  return true;
}

Set class_escape(char e) {
  Set s;
  named_class(std::string(1, static_cast<char>(e | 0x20)), &s);
  return e >= 'A' && e <= 'Z' ? ~s : s;
}

std::string hex(unsigned c) {
  static const char* const kDigits = "0123456789abcdef";
  return std::string("\\x") + kDigits[(c >> 4) & 15] + kDigits[c & 15];
}

// A byte as RE2 reads it literally (Latin-1 mode: one byte, one character).
std::string literal(unsigned char c) {
  if ((c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')) return std::string(1, static_cast<char>(c));
  return hex(c);
}

std::string class_syntax(const Set& s) {
  if (s.none()) return "[^\\x00-\\xff]";  // ECMAScript's [] never matches
  std::string out = "[";
  for (unsigned c = 0; c < 256;) {
    if (!s[c]) {
      ++c;
      continue;
    }
    unsigned e = c;
    while (e + 1 < 256 && s[e + 1]) ++e;
    out += hex(c);
    if (e > c) out += "-" + hex(e);
    c = e + 1;
  }
  return out + "]";
}

struct Escape {
  enum Kind { kChar, kClass, kWordBoundary, kNotWordBoundary } kind = kChar;
  unsigned char c = 0;
  Set set;
};

// The escape at p[i] == '\\', as libstdc++'s ECMAScript scanner reads it
// (an unknown letter stands for itself); leaves i past it.
Escape escape(const std::string& p, size_t& i, bool in_set) {
  const size_t at = i;
  if (i + 1 >= p.size()) refuse("trailing backslash " + column(at));
  const char e = p[i + 1];
  i += 2;
  Escape out;
  auto chr = [&](char c) {
    out.c = static_cast<unsigned char>(c);
    return out;
  };
  switch (e) {
    case '0': return chr('\0');
    case 'b':
      if (in_set) return chr('\b');
      out.kind = Escape::kWordBoundary;
      return out;
    case 'B':
      if (in_set) refuse("\\B inside [...] " + column(at));
      out.kind = Escape::kNotWordBoundary;
      return out;
    case 'f': return chr('\f');
    case 'n': return chr('\n');
    case 'r': return chr('\r');
    case 't': return chr('\t');
    case 'v': return chr('\v');
    case 'd': case 'D': case 's': case 'S': case 'w': case 'W':
      out.kind = Escape::kClass;
      out.set = class_escape(e);
      return out;
    case 'c':
      // libstdc++ read \cJ as 'J', not as a control character: refused
      // rather than given either meaning silently.
      refuse("control escape \\c " + column(at) + " is not supported (write \\x0a for a newline)");
    case 'x': case 'u': {
      const size_t n = e == 'x' ? 2 : 4;
      unsigned v = 0;
      for (size_t k = 0; k < n; ++k, ++i) {
        if (i >= p.size() || !is_xdigit(p[i]))
          refuse(std::string("\\") + e + " " + column(at) + " needs " + std::to_string(n) + " hex digits");
        v = v * 16 + static_cast<unsigned>(is_digit(p[i]) ? p[i] - '0' : (p[i] | 0x20) - 'a' + 10);
      }
      if (v > 0xff)
        refuse("\\u" + p.substr(at + 2, 4) + " " + column(at) +
               " is above \\u00ff: names are matched byte by byte, so write its UTF-8 bytes");
      return chr(static_cast<char>(v));
    }
    default:
      if (is_digit(e)) {
        size_t end = i;
        while (end < p.size() && is_digit(p[end])) ++end;
        refuse("back-reference \\" + shortened(p.substr(at + 1, end - at - 1)) + " " + column(at) +
               ": back-references are not supported (no linear-time matcher can run them)");
      }
      return chr(e);
  }
}

// One term inside [...]: a character, a class, '-' or the closing ']'.
struct Term {
  enum Kind { kEnd, kDash, kChar, kClass } kind = kChar;
  unsigned char c = 0;
  Set set;
};

Term set_term(const std::string& p, size_t& i) {
  Term t;
  const char c = p[i];
  if (c == ']' || c == '-') {
    t.kind = c == ']' ? Term::kEnd : Term::kDash;
    ++i;
  } else if (c == '[' && i + 1 < p.size() && std::strchr(".:=", p[i + 1]) && p[i + 1] != '\0') {
    const char kind = p[i + 1];
    const size_t close = p.find(std::string(1, kind) + "]", i + 2);
    if (kind != ':')
      refuse("collating element or equivalence class '[" + std::string(1, kind) + "' " + column(i) +
             " is not supported");
    if (close == std::string::npos || !named_class(p.substr(i + 2, close - i - 2), &t.set))
      refuse("invalid character class name " + column(i) +
             " (alnum, alpha, blank, cntrl, digit, graph, lower, print, punct, space, upper, xdigit)");
    t.kind = Term::kClass;
    i = close + 2;
  } else if (c == '\\') {
    const Escape e = escape(p, i, true);
    t.kind = e.kind == Escape::kClass ? Term::kClass : Term::kChar;
    t.c = e.c;
    t.set = e.set;
  } else {
    t.c = static_cast<unsigned char>(c);
    ++i;
  }
  return t;
}

// [...] with p[at] == '['; leaves i past the closing ']'. Follows
// libstdc++'s ECMAScript rules: "[]" matches nothing, "[^]" anything, a '-'
// first, last or right after a range is itself.
Set bracket(const std::string& p, size_t at, size_t& i) {
  i = at + 1;
  const bool negate = i < p.size() && p[i] == '^';
  if (negate) ++i;
  Set s;
  enum { kNothing, kChar, kClass } last = kNothing;
  unsigned char last_c = 0;
  auto push_char = [&](unsigned char ch) {
    if (last == kChar) s.set(last_c);
    last = kChar;
    last_c = ch;
  };
  auto unclosed = [&] { refuse("unbalanced '[': the '[' " + column(at) + " is never closed"); };
  for (bool first = true;; first = false) {
    if (i >= p.size()) unclosed();
    const size_t term_at = i;
    const Term t = set_term(p, i);
    if (t.kind == Term::kEnd) break;
    if (t.kind == Term::kChar) {
      push_char(t.c);
    } else if (t.kind == Term::kClass) {
      if (last == kChar) s.set(last_c);
      s |= t.set;
      last = kClass;
    } else if (first || last == kNothing) {
      push_char('-');
    } else if (i < p.size() && p[i] == ']') {
      push_char('-');
    } else if (last == kClass) {
      refuse("invalid character range " + column(term_at) + ": a class such as \\w cannot start a range");
    } else {
      if (i >= p.size()) unclosed();
      const size_t end_at = i;
      const Term end = set_term(p, i);
      if (end.kind != Term::kChar && end.kind != Term::kDash)
        refuse("invalid character range " + column(end_at) + ": it must end with a character");
      const unsigned char hi = end.kind == Term::kDash ? '-' : end.c;
      if (hi < last_c) refuse("invalid character range (e.g. [b-a]) " + column(term_at - 1));
      for (unsigned ch = last_c; ch <= hi; ++ch) s.set(ch);
      last = kNothing;
    }
  }
  if (last == kChar) s.set(last_c);
  return negate ? ~s : s;
}

// A quantifier at p[i] (* + ? {m} {m,} {m,n}, then an optional lazy '?')
// in RE2's syntax; leaves i past it.
std::string quantifier(const std::string& p, size_t& i) {
  const size_t at = i;
  std::string q(1, p[i]);
  if (p[i] == '{') {
    size_t k = i + 1;
    auto count = [&](std::string* digits) {
      const size_t start = k;
      while (k < p.size() && is_digit(p[k])) ++k;
      *digits = p.substr(start, k - start);
      if (digits->size() > 4 || (!digits->empty() && std::stoul(*digits) > kMaxRepeat))
        refuse("repetition count " + shortened(*digits) + " is too large (at most " + std::to_string(kMaxRepeat) +
               "), " + column(at));
      return !digits->empty();
    };
    std::string lo, hi;
    bool ok = count(&lo), comma = false;
    if (ok && k < p.size() && p[k] == ',') {
      comma = true;
      ++k;
      if (k < p.size() && p[k] != '}') ok = count(&hi);
    }
    if (!ok || k >= p.size() || p[k] != '}')
      refuse("invalid {m,n} repetition " + column(at) + " (write \\{ for the character)");
    if (!hi.empty() && std::stoul(hi) < std::stoul(lo)) refuse("invalid {m,n} repetition " + column(at) + ": m > n");
    q = "{" + lo + (comma ? "," + hi : "") + "}";
    i = k + 1;
  } else {
    ++i;
  }
  if (i < p.size() && p[i] == '?') {
    q += '?';
    ++i;
  }
  return q;
}

// "(", "(?:" or a refusal of the other "(?" forms; leaves i past it.
std::string group_open(const std::string& p, size_t& i) {
  const size_t at = i++;
  if (i >= p.size() || p[i] != '?') return "(";
  const char kind = i + 1 < p.size() ? p[i + 1] : '\0';
  if (kind == ':') {
    i += 2;
    return "(?:";
  }
  if (kind == '=' || kind == '!')
    refuse(std::string("lookahead '(?") + kind + "' " + column(at) +
           ": lookahead is not supported (no linear-time matcher runs it)");
  refuse("'(?' " + column(at) + " is neither a group '(?:' nor a lookahead");
}

std::string re2_reason(const re2::RE2& re) {
  switch (re.error_code()) {
    case re2::RE2::ErrorRepeatSize:
      return "repetition counts nested in each other multiply to more than " + std::to_string(kMaxRepeat);
    case re2::RE2::ErrorPatternTooLarge: return "the compiled pattern is too large (fewer or smaller repetitions)";
    default: return "refused by RE2: " + re.error();
  }
}

}  // namespace

std::string shown(const std::string& text) {
  constexpr size_t kShown = 60;
  if (text.size() <= kShown + 20) return "'" + text + "'";
  return "'" + text.substr(0, kShown) + "...' (" + std::to_string(text.size()) + " characters)";
}

namespace {

// One pass over an ECMAScript pattern, writing RE2 syntax as it goes.
class Translator {
 public:
  explicit Translator(const std::string& p) : p_(p) {}

  Translated run() {
    while (i_ < p_.size()) step();
    if (!open_.empty()) refuse("unbalanced '(' or ')': the '(' " + column(open_at_.back()) + " is never closed");
    Translated t;
    t.syntax = std::move(out_);
    if (alternation_) return t;
    size_t lead = 0, tail = top_.size();
    while (lead < top_.size() && top_[lead] >= 0) t.prefix += static_cast<char>(top_[lead++]);
    t.literal = lead == top_.size();
    while (!t.literal && tail > lead && top_[tail - 1] >= 0) --tail;
    for (size_t k = tail; !t.literal && k < top_.size(); ++k) t.suffix += static_cast<char>(top_[k]);
    return t;
  }

 private:
  void step() {
    const char c = p_[i_];
    const size_t at = i_;
    if (c == '*' || c == '+' || c == '?' || c == '{') return quantify(c, at);
    repeated_ = false;
    if (c == '\\') {
      const Escape e = escape(p_, i_, false);
      if (e.kind == Escape::kWordBoundary || e.kind == Escape::kNotWordBoundary)
        return assertion(e.kind == Escape::kWordBoundary ? "\\b" : "\\B", -1);
      return e.kind == Escape::kClass ? atom(class_syntax(e.set), -1) : atom(literal(e.c), e.c);
    }
    if (c == '(') {
      open_.push_back(out_.size());
      open_at_.push_back(at);
      out_ += group_open(p_, i_);
      atom_ = kNone;
      return;
    }
    if (c == '[') return atom(class_syntax(bracket(p_, at, i_)), -1);
    ++i_;
    if (c == ')') return close(at);
    if (c == '|') alternation_ |= open_.empty();
    // A full match starts and ends where '^' first and '$' last assert.
    if (c == '|' || c == '^' || c == '$')
      return assertion(std::string(1, c), (c == '^' && at == 0) || (c == '$' && i_ == p_.size()) ? -2 : -1);
    // ECMAScript's '.' takes neither line terminator.
    if (c == '.') return atom("[^\\x0a\\x0d]", -1);
    atom(literal(static_cast<unsigned char>(c)), static_cast<unsigned char>(c));
  }

  void quantify(char c, size_t at) {
    const std::string q = quantifier(p_, i_);
    if (atom_ == kNone)
      refuse(std::string("'") + c + "' " + (at == 0 ? std::string("at the start") : column(at)) +
             " has nothing to repeat");
    // ECMAScript stacks quantifiers ("a+*"); RE2 wants each on a group.
    if (repeated_) {
      out_.insert(atom_, "(?:");
      out_ += ')';
    }
    out_ += q;
    if (open_.empty() && !top_.empty()) top_.back() = -1;
    repeated_ = true;
  }

  // `byte`: the literal byte it stands for, or -1.
  void atom(const std::string& syntax, int byte) {
    atom_ = out_.size();
    out_ += syntax;
    if (open_.empty()) top_.push_back(byte);
  }

  // Nothing to repeat after it; `byte` -2 when it constrains no full match.
  void assertion(const std::string& syntax, int byte) {
    out_ += syntax;
    if (open_.empty() && byte != -2) top_.push_back(-1);
    atom_ = kNone;
  }

  void close(size_t at) {
    if (open_.empty()) refuse("unbalanced '(' or ')': the ')' " + column(at) + " closes no group");
    out_ += ')';
    atom_ = open_.back();
    open_.pop_back();
    open_at_.pop_back();
    if (open_.empty()) top_.push_back(-1);
  }

  const std::string& p_;
  size_t i_ = 0;
  std::string out_;
  std::vector<size_t> open_, open_at_;  // per open group: where it starts in out_, its column
  size_t atom_ = kNone;                 // where the last repeatable atom starts in out_
  bool repeated_ = false;               // that atom has a quantifier already
  std::vector<int> top_;                // the top level's atoms: a literal byte, or -1
  bool alternation_ = false;            // at the top level
};

}  // namespace

Translated translate(const std::string& p) {
  if (p.size() > kMaxPatternLength)
    refuse("the pattern is " + std::to_string(p.size()) + " characters long (at most " +
           std::to_string(kMaxPatternLength) + ")");
  return Translator(p).run();
}

EcmaRegex::EcmaRegex(const std::string& pattern, int64_t max_mem) {
  re2::RE2::Options o;
  o.set_encoding(re2::RE2::Options::EncodingLatin1);
  o.set_log_errors(false);
  o.set_max_mem(max_mem);
  guard_ = translate(pattern);
  re_ = std::make_unique<re2::RE2>(guard_.syntax, o);
  if (!re_->ok()) throw RegexError(re2_reason(*re_));
  guard_.syntax.clear();
}

EcmaRegex::~EcmaRegex() = default;

bool EcmaRegex::full_match(const std::string& text) const {
  const std::string &prefix = guard_.prefix, &suffix = guard_.suffix;
  if (guard_.literal) return text == prefix;
  if (text.size() < prefix.size() + suffix.size() || text.compare(0, prefix.size(), prefix) != 0 ||
      text.compare(text.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  return re2::RE2::FullMatch(text, *re_);
}

bool EcmaRegex::full_match(const std::string& text, std::vector<std::string>* groups) const {
  std::vector<re2::StringPiece> m(static_cast<size_t>(re_->NumberOfCapturingGroups()) + 1);
  if (!re_->Match(text, 0, text.size(), re2::RE2::ANCHOR_BOTH, m.data(), static_cast<int>(m.size()))) return false;
  groups->clear();
  for (const auto& g : m) groups->push_back(g.data() ? std::string(g.data(), g.size()) : std::string());
  return true;
}

int EcmaRegex::groups() const { return re_->NumberOfCapturingGroups(); }

}  // namespace shardplan::regex_detail
