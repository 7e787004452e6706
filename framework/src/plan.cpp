#include "shardplan/plan.h"

#include "plan_data_parallel.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <bitset>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>

namespace shardplan {
namespace fs = std::filesystem;

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
// without an overflow check.
constexpr unsigned long kMaxRepeat = 1000;

size_t digits_at(const std::string& s, size_t i) {
  size_t j = i;
  while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
  return j - i;
}

// Why `pattern` is refused before std::regex sees it, or "". Bracket
// expressions hold neither counts nor back-references.
std::string refused_syntax(const std::string& pattern) {
  bool in_set = false;
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

std::shared_ptr<const Matcher> compile(const std::string& pattern, const SourceLoc& loc) {
  const std::string refused = refused_syntax(pattern);
  if (!refused.empty()) throw PlanError(loc, "invalid regex '" + pattern + "': " + refused);
  try {
    return std::make_shared<const Matcher>(pattern);
  } catch (const std::regex_error& e) {
    throw PlanError(loc, "invalid regex '" + pattern + "': " + regex_reason(pattern, e) +
                             " (ECMAScript syntax, matched against the whole parameter name)");
  }
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::optional<int> parse_positive_int(const std::string& s) {
  int value = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, value);
  if (ec != std::errc() || ptr != end || s.empty() || value < 1) return std::nullopt;
  return value;
}

std::string mesh_spec_str(const std::vector<MeshAxisSpec>& mesh) {
  std::vector<std::string> parts;
  for (const auto& axis : mesh)
    parts.push_back(axis.name + ": " +
                    (axis.size == MeshAxisSpec::kAutoSize ? "auto" : std::to_string(axis.size)));
  return "{" + join(parts, ", ") + "}";
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::vector<std::string> dims;
  for (int64_t d : shape) dims.push_back(std::to_string(d));
  return "[" + join(dims, ", ") + "]";
}

// --- Canonical YAML scalars -------------------------------------------------

bool is_plain_safe(const std::string& s) {
  if (s.empty()) return false;
  static const std::set<std::string> kReserved = {"null", "true", "false", "yes", "no",
                                                  "on",   "off",  "y",     "n",   "~"};
  std::string lower = s;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  if (kReserved.count(lower)) return false;
  const char first = s[0];
  if (!(std::isalnum(static_cast<unsigned char>(first)) || first == '_' || first == '/' || first == '.'))
    return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' || c == '/'))
      return false;
  return true;
}

std::string quoted(const std::string& s) {
  bool has_control = false;
  for (unsigned char c : s) has_control |= (c < 0x20 || c == 0x7f);
  if (!has_control) {
    std::string out = "'";
    for (char c : s) out += (c == '\'') ? std::string("''") : std::string(1, c);
    return out + "'";
  }
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string scalar(const std::string& s) { return is_plain_safe(s) ? s : quoted(s); }

// --- Parsing ----------------------------------------------------------------

const char* kind_name(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Null: return "nothing";
    default: return "a scalar";
  }
}

class Parser {
 public:
  Parser(std::string source, std::string base_dir)
      : source_(std::move(source)), base_dir_(std::move(base_dir)) {}

  Plan parse(const std::string& text) {
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::ParserException& e) {
      throw PlanError(at(e.mark), "invalid YAML: " + e.msg);
    }
    const SourceLoc top{source_, 1, 1};
    if (!root.IsDefined() || root.IsNull())
      throw PlanError(top, "the plan is empty; expected a map with mesh and rules");
    if (!root.IsMap())
      throw PlanError(at(root, top),
                      std::string("a plan must be a map with mesh and rules, got ") + kind_name(root));

    Plan plan;
    plan.source = source_;
    std::optional<Entry> mesh, rules;
    for (const Entry& e : entries(root, "", kTopKeys)) {
      if (e.key == "version")
        parse_version(e, plan);
      else if (e.key == "mesh")
        mesh = e;
      else if (e.key == "plugins")
        parse_plugins(e, plan);
      else if (e.key == "strict")
        parse_strict(e, plan);
      else if (e.key == "rules")
        rules = e;
      else if (e.key == "batch_axis")
        detail::parse_batch_axis(e.value, at(e.value, e.key_loc), plan);
      else if (e.key == "data_parallel")
        detail::parse_data_parallel(e.value, at(e.value, e.key_loc), plan);
      else if (!e.value.IsScalar() && !e.value.IsNull())  // name, description
        throw PlanError(at(e.value, e.key_loc), e.key + " must be text, got " + kind_name(e.value));
    }
    const SourceLoc root_loc = at(root, top);
    if (!mesh) throw PlanError(root_loc, "missing 'mesh' (e.g. mesh: {model: auto})");
    if (!rules) throw PlanError(root_loc, "missing 'rules' (a list of {match: <regex>, layout: [...]})");
    parse_mesh(*mesh, plan);
    detail::check_batch_axis(plan);
    parse_rules(*rules, plan);
    return plan;
  }

 private:
  struct Entry {
    std::string key;
    SourceLoc key_loc;
    YAML::Node value;
  };

  inline static const std::vector<std::string> kTopKeys = {
      "version", "mesh", "plugins", "strict", "batch_axis", "data_parallel", "rules", "name", "description"};
  inline static const std::vector<std::string> kRuleKeys = {"match", "layout", "output",
                                                            "input", "blocks", "plugin"};

  SourceLoc at(const YAML::Mark& m) const {
    if (m.is_null()) return SourceLoc{source_, 0, 0};
    return SourceLoc{source_, m.line + 1, m.column + 1};
  }
  // A null value's mark points at whatever token follows it, so such values
  // are reported at their key instead.
  SourceLoc at(const YAML::Node& n, const SourceLoc& key_loc) const {
    if (n.IsNull() || n.Mark().is_null()) return key_loc;
    return at(n.Mark());
  }

  // The map's entries, in order, after rejecting non-string, duplicate and
  // unknown keys. `where` completes messages: "" or " in rule".
  std::vector<Entry> entries(const YAML::Node& map, const std::string& where,
                             const std::vector<std::string>& known) const {
    std::vector<Entry> out;
    std::set<std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const SourceLoc key_loc = at(it->first.Mark());
      if (!it->first.IsScalar())
        throw PlanError(key_loc, "keys" + where + " must be names, got " + kind_name(it->first));
      const std::string key = it->first.Scalar();
      if (std::find(known.begin(), known.end(), key) == known.end())
        throw PlanError(key_loc,
                        "unknown key '" + key + "'" + where + " (expected " + join(known, ", ") + ")");
      if (!seen.insert(key).second) throw PlanError(key_loc, "duplicate key '" + key + "'" + where);
      out.push_back({key, key_loc, it->second});
    }
    return out;
  }

  void parse_version(const Entry& e, Plan& plan) const {
    if (!e.value.IsScalar() || e.value.Scalar() != "1")
      throw PlanError(at(e.value, e.key_loc),
                      "unsupported version " +
                          (e.value.IsScalar() ? "'" + e.value.Scalar() + "'" : kind_name(e.value)) +
                          " (this shardplan reads version 1)");
    plan.version = 1;
  }

  void parse_strict(const Entry& e, Plan& plan) const {
    bool value = true;
    if (!e.value.IsScalar() || !YAML::convert<bool>::decode(e.value, value))
      throw PlanError(at(e.value, e.key_loc), "strict must be true or false");
    plan.strict = value;
  }

  void parse_plugins(const Entry& e, Plan& plan) const {
    const char* expected =
        "plugins must be a list of directories, e.g. plugins: [../build/lib/shardplan/plugins]";
    if (!e.value.IsSequence()) throw PlanError(at(e.value, e.key_loc), expected);
    for (const auto& dir : e.value) {
      if (!dir.IsScalar() || dir.Scalar().empty()) throw PlanError(at(dir, e.key_loc), expected);
      fs::path p(dir.Scalar());
      // Relative to the plan file, so a plan and its plugins can move together.
      if (p.is_relative()) p = fs::absolute(fs::path(base_dir_) / p);
      plan.plugin_dirs.push_back(p.lexically_normal().string());
    }
  }

  void parse_mesh(const Entry& e, Plan& plan) const {
    plan.mesh_loc = at(e.value, e.key_loc);
    if (!e.value.IsMap())
      throw PlanError(plan.mesh_loc,
                      std::string("mesh must be a map of axis name to size, e.g. {model: auto}; got ") +
                          kind_name(e.value));
    if (e.value.size() == 0) throw PlanError(plan.mesh_loc, "mesh must name at least one axis");
    std::optional<std::string> auto_axis;
    for (auto it = e.value.begin(); it != e.value.end(); ++it) {
      MeshAxisSpec axis;
      axis.loc = at(it->first.Mark());
      if (!it->first.IsScalar() || it->first.Scalar().empty())
        throw PlanError(axis.loc, "mesh axis names must be non-empty names");
      axis.name = it->first.Scalar();
      for (const auto& other : plan.mesh)
        if (other.name == axis.name) throw PlanError(axis.loc, "duplicate axis '" + axis.name + "' in mesh");
      const SourceLoc size_loc = at(it->second, axis.loc);
      const std::string size = it->second.IsScalar() ? it->second.Scalar() : "";
      if (size == "auto") {
        if (auto_axis)
          throw PlanError(size_loc, "axis '" + axis.name + "' is auto but '" + *auto_axis +
                                        "' already is; at most one mesh axis can be auto");
        axis.size = MeshAxisSpec::kAutoSize;
      } else if (auto n = parse_positive_int(size)) {
        axis.size = *n;
      } else {
        throw PlanError(size_loc, "mesh axis '" + axis.name +
                                      "' must have an integer size >= 1 or auto, got " +
                                      (it->second.IsScalar() ? "'" + size + "'" : kind_name(it->second)));
      }
      if (axis.size == MeshAxisSpec::kAutoSize) auto_axis = axis.name;
      plan.mesh.push_back(axis);
    }
  }

  void parse_rules(const Entry& e, Plan& plan) const {
    if (!e.value.IsSequence())
      throw PlanError(
          at(e.value, e.key_loc),
          std::string("rules must be a list of {match: <regex>, layout: [...]}; got ") + kind_name(e.value));
    std::vector<std::string> axes;
    for (const auto& a : plan.mesh) axes.push_back(a.name);
    for (const auto& node : e.value) {
      Rule rule;
      rule.index = plan.rules.size();
      rule.loc = at(node, at(e.value.Mark()));
      const std::string name = "rule " + std::to_string(rule.index + 1);
      if (!node.IsMap())
        throw PlanError(rule.loc, name + " must be a map with match and layout, got " + kind_name(node));
      std::optional<Entry> match, layout;
      for (const Entry& field : entries(node, " in rule", kRuleKeys)) {
        if (field.key == "match")
          match = field;
        else if (field.key == "layout")
          layout = field;
        else
          parse_option(field, rule);
      }
      if (!match) throw PlanError(rule.loc, name + " has no 'match' (a regex over parameter names)");
      if (!layout) throw PlanError(rule.loc, name + " has no 'layout' (a mesh axis or null per tensor dim)");

      rule.pattern_loc = at(match->value, match->key_loc);
      if (!match->value.IsScalar())
        throw PlanError(rule.pattern_loc,
                        "match must be a regex string, got " + std::string(kind_name(match->value)));
      rule.pattern = match->value.Scalar();
      rule.matcher = compile(rule.pattern, rule.pattern_loc);

      rule.layout_loc = at(layout->value, layout->key_loc);
      rule.layout = parse_layout(*layout, axes);
      plan.rules.push_back(std::move(rule));
    }
  }

  Layout parse_layout(const Entry& e, const std::vector<std::string>& axes) const {
    if (!e.value.IsSequence())
      throw PlanError(at(e.value, e.key_loc),
                      std::string("layout must be a list with a mesh axis or null per tensor dim, "
                                  "e.g. [model, null]; got ") +
                          kind_name(e.value));
    Layout layout;
    for (const auto& entry : e.value) {
      const SourceLoc loc = at(entry.Mark());
      if (entry.IsNull()) {
        layout.push_back(std::nullopt);
        continue;
      }
      if (!entry.IsScalar())
        throw PlanError(
            loc, std::string("layout entries must be a mesh axis name or null, got ") + kind_name(entry));
      const std::string axis = entry.Scalar();
      if (std::find(axes.begin(), axes.end(), axis) == axes.end())
        throw PlanError(loc, "unknown axis '" + axis + "' in layout; mesh axes are: " + join(axes, ", "));
      for (const auto& prev : layout)
        if (prev == axis)
          throw PlanError(loc, "axis '" + axis +
                                   "' appears twice in layout; a tensor can be split over an axis only once");
      layout.push_back(axis);
    }
    return layout;
  }

  // The options the kernel's layers understand, checked here so a typo fails
  // when the plan is loaded rather than when some plugin first reads it.
  void parse_option(const Entry& e, Rule& rule) const {
    const SourceLoc loc = at(e.value, e.key_loc);
    const std::string got = e.value.IsScalar() ? "'" + e.value.Scalar() + "'" : kind_name(e.value);
    const std::string value = e.value.IsScalar() ? e.value.Scalar() : "";
    auto require = [&](bool ok, const std::string& expected) {
      if (!ok) throw PlanError(loc, e.key + " must be " + expected + ", got " + got);
    };
    if (e.key == "output")
      require(value == "sharded" || value == "gathered", "sharded or gathered");
    else if (e.key == "input")
      require(value == "sharded" || value == "replicated", "sharded or replicated");
    else if (e.key == "blocks")
      require(parse_positive_int(value).has_value(), "an integer >= 1");
    else if (e.key == "plugin")
      require(e.value.IsScalar() && !value.empty(), "a plugin name, e.g. dense");
    rule.options[e.key] = RuleOption{value, loc};
  }

  std::string source_;
  std::string base_dir_;
};

}  // namespace

// ---------------------------------------------------------------------------

std::string layout_str(const Layout& layout) {
  std::vector<std::string> parts;
  for (const auto& dim : layout) parts.push_back(dim ? *dim : "null");
  return "[" + join(parts, ", ") + "]";
}

bool Rule::matches(const std::string& path) const {
  // Rules built in code rather than parsed have no matcher yet.
  if (!matcher) return compile(pattern, pattern_loc)->matches(path);
  return matcher->matches(path);
}

const RuleOption* Rule::option(const std::string& key) const {
  auto it = options.find(key);
  return it == options.end() ? nullptr : &it->second;
}

std::string Rule::option_or(const std::string& key, const std::string& fallback,
                            const std::vector<std::string>& allowed) const {
  const RuleOption* opt = option(key);
  if (!opt) return fallback;
  if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), opt->value) == allowed.end())
    throw PlanError(opt->loc, key + " must be one of " + join(allowed, ", ") + ", got '" + opt->value + "'");
  return opt->value;
}

const Rule* Plan::match(const std::string& path) const {
  for (const Rule& rule : rules)
    if (rule.matches(path)) return &rule;
  return nullptr;
}

Mesh Plan::resolve_mesh(int world_size) const {
  if (world_size < 1) throw Error("world size must be >= 1, got " + std::to_string(world_size));
  int64_t fixed = 1;
  const MeshAxisSpec* auto_axis = nullptr;
  for (const auto& axis : mesh) {
    if (axis.size == MeshAxisSpec::kAutoSize)
      auto_axis = &axis;
    else
      fixed *= axis.size;
  }
  const std::string spec = mesh_spec_str(mesh);
  const std::string world =
      "the world has " + std::to_string(world_size) + " rank" + (world_size == 1 ? "" : "s");
  if (auto_axis && world_size % fixed != 0)
    throw PlanError(mesh_loc, "mesh " + spec + " needs a world size divisible by " + std::to_string(fixed) +
                                  " but " + world);
  if (!auto_axis && fixed != world_size)
    throw PlanError(mesh_loc, "mesh " + spec + " has " + std::to_string(fixed) + " ranks but " + world);
  std::vector<std::pair<std::string, int>> axes;
  for (const auto& axis : mesh)
    axes.emplace_back(
        axis.name, axis.size == MeshAxisSpec::kAutoSize ? static_cast<int>(world_size / fixed) : axis.size);
  return Mesh(std::move(axes));
}

PlanMatch Plan::assign(const std::vector<ParamInfo>& params, int world_size,
                       const std::vector<std::string>& module_paths, std::vector<std::string>* errors) const {
  PlanMatch out;
  out.mesh = resolve_mesh(world_size);
  std::vector<size_t> hits(rules.size(), 0);
  out.params.reserve(params.size());
  for (const ParamInfo& p : params) {
    Assignment a;
    a.path = p.path;
    a.shape = p.shape;
    a.rule = match(p.path);
    if (a.rule) {
      const Rule& r = *a.rule;
      if (r.layout.size() != p.shape.size()) {
        auto dims = [](size_t n) { return std::to_string(n) + (n == 1 ? " dim" : " dims"); };
        const PlanError err(r.layout_loc, "layout " + layout_str(r.layout) + " has " + dims(r.layout.size()) +
                                              " but parameter '" + p.path + "' has " + dims(p.shape.size()) +
                                              " (shape " + shape_str(p.shape) + ")");
        if (!errors) throw err;
        errors->push_back(err.what());
        ++hits[static_cast<size_t>(a.rule - rules.data())];
        a.rule = nullptr;
      }
    }
    if (a.rule) {
      a.layout = a.rule->layout;
      ++hits[static_cast<size_t>(a.rule - rules.data())];
    } else {
      a.layout = Layout(p.shape.size());
    }
    out.params.push_back(std::move(a));
  }
  out.modules.reserve(module_paths.size());
  for (const std::string& path : module_paths) {
    Assignment a;
    a.path = path;
    a.rule = match(path);
    if (a.rule) {
      a.layout = a.rule->layout;
      ++hits[static_cast<size_t>(a.rule - rules.data())];
    }
    out.modules.push_back(std::move(a));
  }
  for (size_t i = 0; i < rules.size(); ++i) {
    if (hits[i]) continue;
    const PlanError err(rules[i].loc, "rule " + std::to_string(i + 1) + " (match: '" + rules[i].pattern +
                                          "') matched no parameter");
    if (strict && !errors) throw err;
    (strict ? *errors : out.warnings).push_back(err.what());
  }
  return out;
}

std::string Plan::to_yaml() const {
  std::ostringstream y;
  y << "version: " << version << "\n";
  std::vector<std::string> axes;
  for (const auto& axis : mesh)
    axes.push_back(scalar(axis.name) + ": " +
                   (axis.size == MeshAxisSpec::kAutoSize ? "auto" : std::to_string(axis.size)));
  y << "mesh: {" << join(axes, ", ") << "}\n";
  if (!plugin_dirs.empty()) {
    std::vector<std::string> dirs;
    for (const auto& d : plugin_dirs) dirs.push_back(scalar(d));
    y << "plugins: [" << join(dirs, ", ") << "]\n";
  }
  y << "strict: " << (strict ? "true" : "false") << "\n";
  y << detail::data_parallel_yaml(*this);
  if (rules.empty()) {
    y << "rules: []\n";
    return y.str();
  }
  y << "rules:\n";
  for (const Rule& rule : rules) {
    // Patterns always quoted: regexes are full of characters YAML treats specially.
    y << "  - match: " << quoted(rule.pattern) << "\n";
    std::vector<std::string> dims;
    for (const auto& dim : rule.layout) dims.push_back(dim ? scalar(*dim) : "null");
    y << "    layout: [" << join(dims, ", ") << "]\n";
    for (const auto& [key, opt] : rule.options) y << "    " << key << ": " << scalar(opt.value) << "\n";
  }
  return y.str();
}

Plan parse_plan(const std::string& yaml_text, const std::string& source_name, const std::string& base_dir) {
  return Parser(source_name, fs::absolute(base_dir).lexically_normal().string()).parse(yaml_text);
}

Plan load_plan(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error("plan file '" + path + "' not found");
  if (fs::is_directory(path, ec)) throw Error("plan file '" + path + "' is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read plan file '" + path + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error("cannot read plan file '" + path + "'");
  return parse_plan(text, path, fs::absolute(path).parent_path().string());
}

}  // namespace shardplan
