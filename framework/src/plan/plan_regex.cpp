#include <bitset>
#include <cctype>
#include <cstring>
#include <regex>
#include <string>

#include "plan_internal.h"

namespace shardplan {

// ---------------------------------------------------------------------------
// Matcher: a rule's pattern, compiled once. std::regex is slow (microseconds
// per match), and plans are matched against every parameter of large models,
// so literal patterns become a string compare and the others are guarded by
// the literal prefix and suffix every full match must have. Patterns in the
// subset SimplePattern understands (what rules like 'blocks\.\d+\.fc1\.weight'
// use) skip std::regex altogether.

// A sequence of single-character atoms (a literal, '.', \d \w \s and their
// negations, a [...] set), each with an optional quantifier (* + ? {n} {n,}
// {n,m}, greedy or lazy), optionally between '^' and '$'. Groups,
// alternation, back-references and the rarer escapes are left to std::regex.
// For this subset a full match exists or not regardless of greediness, so the
// answer is regex_match's. Classes are evaluated with std::regex_traits, as
// std::regex does, so locale-dependent sets agree too.
class SimplePattern {
 public:
  static std::optional<SimplePattern> compile(const std::string& p) {
    SimplePattern out;
    const std::regex_traits<char> traits;
    size_t i = 0, end = p.size();
    if (i < end && p[i] == '^') ++i;
    if (end > i && p[end - 1] == '$' && !escaped(p, end - 1)) --end;
    while (i < end) {
      Atom atom;
      const char c = p[i];
      if (c == '\\') {
        if (i + 1 >= end) return std::nullopt;
        const char e = p[i + 1];
        if (!add_class(traits, e, atom.set)) {
          if (!is_identity_escape(e)) return std::nullopt;
          atom.set.set(static_cast<unsigned char>(e));
        }
        i += 2;
      } else if (c == '[') {
        const size_t close = parse_set(traits, p, i + 1, end, atom.set);
        if (close == std::string::npos) return std::nullopt;
        i = close + 1;
      } else if (c == '.') {
        atom.set.set();
        atom.set.reset('\n');
        atom.set.reset('\r');
        ++i;
      } else if (std::string("^$()|*+?{}]").find(c) != std::string::npos) {
        return std::nullopt;
      } else {
        atom.set.set(static_cast<unsigned char>(c));
        ++i;
      }
      if (i < end && !parse_quantifier(p, i, end, atom)) return std::nullopt;
      // Runs of plain characters become one string compare.
      if (atom.min == 1 && atom.max == 1 && atom.set.count() == 1) {
        size_t ch = 0;
        while (!atom.set.test(ch)) ++ch;
        if (out.atoms_.empty() || out.atoms_.back().literal.empty()) out.atoms_.emplace_back();
        out.atoms_.back().literal += static_cast<char>(ch);
        continue;
      }
      out.varying_ += atom.min != atom.max;
      out.atoms_.push_back(atom);
    }
    return out;
  }

  bool matches(const std::string& s) const {
    // With one quantifier at most, backtracking is linear; with more,
    // remembering failed (atom, position) states keeps overlapping
    // quantifiers from making it exponential. On the stack for names of
    // usual length.
    if (varying_ < 2) {
      NoMemo none;
      return match(s, 0, 0, none);
    }
    const size_t states = (atoms_.size() + 1) * (s.size() + 1);
    if (states <= kStackStates) {
      std::bitset<kStackStates> failed;
      return match(s, 0, 0, failed);
    }
    std::vector<bool> failed(states, false);
    return match(s, 0, 0, failed);
  }

 private:
  struct Atom {
    std::string literal;      // when not empty, this exact text, and set is unused
    std::bitset<256> set;
    size_t min = 1, max = 1;  // max == kMany: unbounded
  };
  struct NoMemo {
    struct Bit {
      operator bool() const { return false; }
      Bit& operator=(bool) { return *this; }
    };
    Bit operator[](size_t) { return {}; }
  };
  static constexpr size_t kMany = static_cast<size_t>(-1);
  static constexpr size_t kStackStates = 4096;

  static bool escaped(const std::string& p, size_t pos) {
    size_t backslashes = 0;
    while (pos > backslashes && p[pos - backslashes - 1] == '\\') ++backslashes;
    return backslashes % 2 == 1;
  }

  static bool is_identity_escape(char e) { return std::string("^$\\.*+?()[]{}|/-").find(e) != std::string::npos; }

  static bool add_class(const std::regex_traits<char>& traits, char e, std::bitset<256>& set) {
    const char* names = "dwsDWS";
    const char* at = std::strchr(names, e);
    if (!at || e == '\0') return false;
    const char name[2] = {static_cast<char>(std::tolower(static_cast<unsigned char>(e))), 0};
    auto cls = traits.lookup_classname(name, name + 1);
    const bool negate = std::isupper(static_cast<unsigned char>(e)) != 0;
    for (int ch = 0; ch < 256; ++ch)
      if (traits.isctype(static_cast<char>(ch), cls) != negate) set.set(static_cast<size_t>(ch));
    return true;
  }

  // [...] starting after '['; returns the index of the closing ']'. Accepts
  // ASCII literals, ranges between them, \d \w \s and identity escapes.
  static size_t parse_set(const std::regex_traits<char>& traits, const std::string& p, size_t i, size_t end,
                          std::bitset<256>& set) {
    bool negate = false;
    if (i < end && p[i] == '^') {
      negate = true;
      ++i;
    }
    if (i < end && p[i] == ']') return std::string::npos;  // "[]" and "[^]" differ across dialects
    const size_t first = i;
    auto literal = [&](size_t& k, int* out) {
      const char c = p[k];
      if (static_cast<unsigned char>(c) >= 0x80 || c == '[') return false;
      // A bare '-' is unambiguous only first or last in the set.
      if (c == '-' && k != first && !(k + 1 < end && p[k + 1] == ']')) return false;
      if (c == '\\') {
        if (k + 1 >= end || !is_identity_escape(p[k + 1])) return false;
        *out = static_cast<unsigned char>(p[k + 1]);
        k += 2;
        return true;
      }
      *out = static_cast<unsigned char>(c);
      ++k;
      return true;
    };
    while (i < end && p[i] != ']') {
      if (p[i] == '\\' && i + 1 < end && std::strchr("dws", p[i + 1]) && p[i + 1] != '\0') {
        add_class(traits, p[i + 1], set);
        i += 2;
        continue;
      }
      int lo = 0;
      if (!literal(i, &lo)) return std::string::npos;
      if (i + 1 < end && p[i] == '-' && p[i + 1] != ']') {
        ++i;
        int hi = 0;
        if (!literal(i, &hi) || hi < lo) return std::string::npos;
        for (int ch = lo; ch <= hi; ++ch) set.set(static_cast<size_t>(ch));
      } else {
        set.set(static_cast<size_t>(lo));
      }
    }
    if (i >= end) return std::string::npos;
    if (negate) set.flip();
    return i;
  }

  static bool parse_quantifier(const std::string& p, size_t& i, size_t end, Atom& atom) {
    const char c = p[i];
    if (c == '*' || c == '+' || c == '?') {
      atom.min = c == '+' ? 1 : 0;
      atom.max = c == '?' ? 1 : kMany;
      ++i;
    } else if (c == '{') {
      auto number = [&](size_t& k, size_t* out) {
        const size_t start = k;
        size_t v = 0;
        while (k < end && std::isdigit(static_cast<unsigned char>(p[k])) && k - start < 6) v = v * 10 + (p[k++] - '0');
        *out = v;
        return k > start && !(k < end && std::isdigit(static_cast<unsigned char>(p[k])));
      };
      size_t k = i + 1;
      if (!number(k, &atom.min)) return false;
      atom.max = atom.min;
      if (k < end && p[k] == ',') {
        ++k;
        atom.max = kMany;
        if (k < end && p[k] != '}' && !number(k, &atom.max)) return false;
      }
      if (k >= end || p[k] != '}' || atom.max < atom.min) return false;
      i = k + 1;
    } else {
      return true;
    }
    if (i < end && p[i] == '?') ++i;  // lazy: same full-match answer
    return !(i < end && std::strchr("*+?{", p[i]) && p[i] != '\0');
  }

  template <class Failed>
  bool match(const std::string& s, size_t a, size_t pos, Failed& failed) const {
    if (a == atoms_.size()) return pos == s.size();
    const size_t state = a * (s.size() + 1) + pos;
    if (failed[state]) return false;
    const Atom& atom = atoms_[a];
    if (!atom.literal.empty())
      return s.compare(pos, atom.literal.size(), atom.literal) == 0 &&
             match(s, a + 1, pos + atom.literal.size(), failed);
    size_t run = 0;
    while (run < atom.max && pos + run < s.size() && atom.set.test(static_cast<unsigned char>(s[pos + run]))) ++run;
    for (size_t k = run + 1; k-- > atom.min;)
      if (match(s, a + 1, pos + k, failed)) return true;
    failed[state] = true;
    return false;
  }

  std::vector<Atom> atoms_;
  size_t varying_ = 0;  // atoms whose repeat count is not fixed
};

// libstdc++'s default executor backtracks, exponential in the name for
// patterns like '(a+)+b' or 'c+++'; its __polynomial extension selects the
// automaton executor, which needs no back-references (refused anyway).
#if defined(__GLIBCXX__)
constexpr auto kRegexFlags = std::regex::ECMAScript | std::regex_constants::__polynomial;
#else
constexpr auto kRegexFlags = std::regex::ECMAScript;
#endif

class Matcher {
 public:
  explicit Matcher(const std::string& pattern)
      : regex_(pattern, kRegexFlags), simple_(SimplePattern::compile(pattern)) {
    analyze(pattern);
  }

  bool matches(const std::string& s) const {
    if (exact_) return s == *exact_;
    if (s.size() < prefix_.size() + suffix_.size()) return false;
    if (s.compare(0, prefix_.size(), prefix_) != 0) return false;
    if (s.compare(s.size() - suffix_.size(), suffix_.size(), suffix_) != 0) return false;
    return simple_ ? simple_->matches(s) : std::regex_match(s, regex_);
  }

 private:
  struct Token {
    bool literal;
    char c;
  };

  // Splits the pattern into literal characters and everything else. Anything
  // it does not fully understand (alternation, unusual escapes, odd brackets)
  // leaves the guards empty, so the regex alone decides: the guards are only
  // ever a necessary condition, never a source of false negatives.
  void analyze(const std::string& p) {
    static const std::string kIdentityEscapes = "^$\\.*+?()[]{}|/-";
    static const std::string kClassEscapes = "dDwWsS";
    std::vector<Token> tokens;
    auto quantify_previous = [&] {
      if (!tokens.empty()) tokens.back().literal = false;
      tokens.push_back({false, 0});
    };
    for (size_t i = 0; i < p.size(); ++i) {
      const char c = p[i];
      if (c == '\\') {
        if (i + 1 == p.size()) return;
        const char e = p[++i];
        if (kIdentityEscapes.find(e) != std::string::npos)
          tokens.push_back({true, e});
        else if (kClassEscapes.find(e) != std::string::npos)
          tokens.push_back({false, 0});
        else
          return;  // \b, \1, \x41, \u0041, \cJ, ...: not worth modelling
      } else if (c == '[') {
        size_t j = i + 1;
        if (j < p.size() && p[j] == '^') ++j;
        if (j < p.size() && p[j] == ']') return;  // "[]" and "[]a]" differ across dialects
        for (; j < p.size() && p[j] != ']'; ++j)
          if (p[j] == '\\') ++j;
        if (j >= p.size()) return;
        i = j;
        tokens.push_back({false, 0});
      } else if (c == '{') {
        const size_t j = p.find('}', i);
        if (j == std::string::npos) return;
        i = j;
        quantify_previous();
      } else if (c == '*' || c == '+' || c == '?') {
        quantify_previous();
      } else if (c == '|' || c == ']' || c == '}') {
        return;
      } else if (c == '.' || c == '(' || c == ')' || c == '^' || c == '$') {
        tokens.push_back({false, 0});
      } else {
        tokens.push_back({true, c});
      }
    }
    std::string prefix, suffix;
    size_t lead = 0;
    while (lead < tokens.size() && tokens[lead].literal) prefix += tokens[lead++].c;
    if (lead == tokens.size()) {
      exact_ = prefix;
      return;
    }
    size_t tail = tokens.size();
    while (tail > lead && tokens[tail - 1].literal) --tail;
    for (size_t k = tail; k < tokens.size(); ++k) suffix += tokens[k].c;
    prefix_ = std::move(prefix);
    suffix_ = std::move(suffix);
  }

  std::regex regex_;
  std::optional<SimplePattern> simple_;  // the pattern without std::regex, when it is that simple
  std::optional<std::string> exact_;  // the pattern is this literal string
  std::string prefix_, suffix_;       // every full match starts/ends with these
};

namespace {

// libstdc++'s regex_error::what() is sometimes misleading ("*a" reports
// mismatched parentheses), so describe the error class ourselves.
std::string regex_reason(const std::string& pattern, const std::regex_error& e) {
  namespace rc = std::regex_constants;
  if (!pattern.empty() && std::string("*+?{").find(pattern[0]) != std::string::npos)
    return std::string("'") + pattern[0] + "' at the start has nothing to repeat";
  switch (e.code()) {
    case rc::error_collate: return "invalid collating element name";
    case rc::error_ctype: return "invalid character class name";
    case rc::error_escape: return "invalid escape or trailing backslash";
    case rc::error_backref: return "back-reference to a group that does not exist";
    case rc::error_brack: return "unbalanced '[' or invalid character in [...]";
    case rc::error_paren: return "unbalanced '(' or ')'";
    case rc::error_brace: return "unbalanced '{' or '}'";
    case rc::error_badbrace: return "invalid {m,n} repetition";
    case rc::error_range: return "invalid character range (e.g. [b-a])";
    case rc::error_badrepeat: return "a repetition (*, +, ?, {m,n}) with nothing to repeat";
    default: return "pattern too complex";
  }
}

// What std::regex is not given. Back-references: with one, libstdc++ can
// only match by backtracking, exponential in the name for patterns like
// '(.*)*\\1x', and parameter paths have no use for them; without, Matcher
// uses its polynomial executor. Large repetition counts: std::regex copies
// an atom once per repetition, so they cost memory and time for nothing
// (parameter names are short), and libstdc++ reads counts into a long
// without an overflow check. Deep nesting and long patterns: libstdc++
// compiles a pattern by recursive descent, a chain of stack frames per
// nested group (about 300 bytes each at -O2, more in sanitized builds) and
// per term of a sequence (about 90 bytes), so some 20,000 nested groups, or
// 100,000 characters, overflow an 8 MiB stack (a crash, not an exception).
// Rules over parameter paths are far shorter and shallower than the limits.
constexpr unsigned long kMaxRepeat = 1000;
constexpr size_t kMaxPatternLength = 4096;
constexpr int kMaxGroupDepth = 100;

size_t digits_at(const std::string& s, size_t i) {
  size_t j = i;
  while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
  return j - i;
}

// Why `pattern` is refused before std::regex sees it, or "". Bracket
// expressions hold neither counts nor back-references.
std::string refused_syntax(const std::string& pattern) {
  if (pattern.size() > kMaxPatternLength)
    return "the pattern is " + std::to_string(pattern.size()) + " characters long (at most " +
           std::to_string(kMaxPatternLength) + ")";
  bool in_set = false;
  int depth = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\') {
      const size_t n = digits_at(pattern, i + 1);
      if (!in_set && n > 0 && pattern[i + 1] != '0')
        return "back-reference \\" + pattern.substr(i + 1, std::min<size_t>(n, 20)) +
               (n > 20 ? "..." : "") + " (back-references are not supported: they make matching exponential)";
      i += std::max<size_t>(n, 1);
    } else if (in_set) {
      if (c == ']') in_set = false;
    } else if (c == '(') {
      if (++depth > kMaxGroupDepth)
        return "groups nested more than " + std::to_string(kMaxGroupDepth) + " deep (at column " +
               std::to_string(i + 1) + " of the pattern)";
    } else if (c == ')') {
      depth = std::max(depth - 1, 0);
    } else if (c == '[') {
      in_set = true;
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') ++i;  // "[]...]": a literal ']' first
    } else if (c == '{') {
      for (size_t j = i + 1; j < pattern.size() && (std::isdigit(static_cast<unsigned char>(pattern[j])) ||
                                                     pattern[j] == ',');) {
        const size_t n = digits_at(pattern, j);
        const std::string count = pattern.substr(j, n);
        if (n > 4 || (n > 0 && std::stoul(count) > kMaxRepeat))
          return "repetition count " + count + " is too large (at most " + std::to_string(kMaxRepeat) + ")";
        j += n;
        if (j < pattern.size() && pattern[j] == ',') ++j;
      }
    }
  }
  return {};
}

// The pattern as error messages quote it: a refused one may be megabytes.
std::string shown(const std::string& pattern) {
  constexpr size_t kShown = 60;
  if (pattern.size() <= kShown + 20) return "'" + pattern + "'";
  return "'" + pattern.substr(0, kShown) + "...' (" + std::to_string(pattern.size()) + " characters)";
}

}  // namespace

namespace plan_detail {

std::shared_ptr<const Matcher> compile(const std::string& pattern, const SourceLoc& loc) {
  const std::string refused = refused_syntax(pattern);
  if (!refused.empty()) throw PlanError(loc, "invalid regex " + shown(pattern) + ": " + refused);
  try {
    return std::make_shared<const Matcher>(pattern);
  } catch (const std::regex_error& e) {
    throw PlanError(loc, "invalid regex " + shown(pattern) + ": " + regex_reason(pattern, e) +
                             " (ECMAScript syntax, matched against the whole parameter name)");
  }
}

}  // namespace plan_detail

bool DivideRule::matches(const std::string& module_path) const {
  if (!matcher) return plan_detail::compile(pattern, loc)->matches(module_path);
  return matcher->matches(module_path);
}

bool Rule::matches(const std::string& path) const {
  // Rules built in code rather than parsed have no matcher yet.
  if (!matcher) return plan_detail::compile(pattern, pattern_loc)->matches(path);
  return matcher->matches(path);
}

}  // namespace shardplan
