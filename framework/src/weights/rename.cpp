// Weight renames run on RE2 (base/ecma_regex.h) with std::regex_replace's
// ECMAScript syntax ($1 for groups): names come from files, and
// std::regex_replace recursed once per character of a name (a 300,000-
// character tensor name overflowed the stack). Here every step is bounded.
#include "weights/rename.h"

#include "base/ecma_regex.h"
#include "shardplan/error.h"
#include "shardplan/weights.h"
#include "weights/weights_internal.h"

namespace shardplan {
namespace weights_detail {
namespace {

// A rule's cost stays linear in the name it rewrites.
constexpr size_t kMaxMatchesPerName = 256;
constexpr size_t kMaxRenamedBytes = 1 << 20;  // a name may not grow past this

}  // namespace

struct Renames::Rule {
  Rule(const std::string& pattern, const std::string& replacement)
      : pattern(pattern), re(pattern, kNamePatternMemory), format(replacement, re) {}
  std::string pattern;
  regex_detail::EcmaRegex re;
  regex_detail::EcmaFormat format;
};

Renames::Renames(const std::vector<std::pair<std::string, std::string>>& rules) {
  check_pattern_count(rules.size(), "WeightsOptions::rename", "rules");
  for (const auto& [pattern, replacement] : rules) {
    try {
      rules_.push_back(std::make_unique<Rule>(pattern, replacement));
    } catch (const regex_detail::RegexError& e) {
      throw Error("WeightsOptions::rename: " + regex_detail::shown(pattern) + " -> " +
                  regex_detail::shown(replacement) + ": " + e.what());
    }
  }
}

Renames::~Renames() = default;

std::string Renames::apply(const std::string& name, const std::string& file) const {
  std::string out = name;
  for (const auto& r : rules_) {
    try {
      out = regex_detail::replace_all(r->re, out, r->format, kMaxMatchesPerName, kMaxRenamedBytes);
    } catch (const regex_detail::RegexError& e) {
      throw Error((file.empty() ? "" : "weights '" + file + "': ") + "tensor " + regex_detail::shown(name) + ": WeightsOptions::rename " +
                  regex_detail::shown(r->pattern) + ": " + e.what());
    }
  }
  return out;
}

void check_pattern_count(size_t count, const std::string& what, const std::string& noun) {
  if (count > kMaxNamePatterns)
    throw Error(what + " has " + std::to_string(count) + " " + noun + " (at most " + std::to_string(kMaxNamePatterns) +
                ")");
}

}  // namespace weights_detail

void check_rename_rules(const std::vector<std::pair<std::string, std::string>>& rename) {
  weights_detail::Renames check(rename);
}

std::string renamed_weight_name(const WeightsOptions& options, const std::string& name) {
  return weights_detail::Renames(options.rename).apply(name, "");
}

}  // namespace shardplan
