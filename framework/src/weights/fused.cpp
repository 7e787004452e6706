// WeightsOptions::fused (weights.h): a file tensor that stacks several model
// parameters along dim 0 is replaced, before matching, by one SourceTensor
// per part: a view of the part's rows of the mapping. Everything downstream
// (rename-free matching, shape checks, shard-on-load, ZeRO-3 slices, dtype
// conversion) then treats a part as a tensor of its own, so a rank reads
// only the rows of each part its shard covers.
#include <ATen/ATen.h>

#include <algorithm>
#include <memory>
#include <set>

#include "base/ecma_regex.h"
#include "shardplan/error.h"
#include "shardplan/weights.h"
#include "weights/weights_internal.h"

namespace shardplan::weights_detail {
namespace {

// A checkpoint fuses a handful of tensor kinds (q/k/v, gate/up); the bounds
// are far above that and keep names and rules from growing without limit.
constexpr size_t kMaxPartsPerRule = 64;
constexpr size_t kMaxPartNameBytes = 1 << 20;

std::string rule_text(const std::string& pattern) { return "WeightsOptions::fused " + regex_detail::shown(pattern); }

struct FusedRule {
  explicit FusedRule(const WeightsOptions::FusedWeight& w) : pattern(w.pattern), re(w.pattern, kNamePatternMemory) {
    for (const auto& part : w.parts) formats.emplace_back(part.first, re);
  }
  std::string pattern;
  regex_detail::EcmaRegex re;
  std::vector<regex_detail::EcmaFormat> formats;
};

std::vector<std::unique_ptr<FusedRule>> compile_fused(const std::vector<WeightsOptions::FusedWeight>& fused) {
  check_pattern_count(fused.size(), "WeightsOptions::fused", "rules");
  std::vector<std::unique_ptr<FusedRule>> rules;
  for (const auto& w : fused) {
    const std::string what = rule_text(w.pattern);
    if (w.parts.empty() || w.parts.size() > kMaxPartsPerRule)
      throw Error(what + " has " + std::to_string(w.parts.size()) + " parts (1 to " + std::to_string(kMaxPartsPerRule) + ")");
    std::set<std::string> names;
    for (const auto& [name, rows] : w.parts) {
      if (rows < 1) throw Error(what + ": part " + regex_detail::shown(name) + " has " + std::to_string(rows) + " rows");
      if (name.empty() || name.size() > kMaxPartNameBytes || !names.insert(name).second)
        throw Error(what + ": part name " + regex_detail::shown(name) + " is empty, too long or given twice");
    }
    try {
      rules.push_back(std::make_unique<FusedRule>(w));
    } catch (const regex_detail::RegexError& e) {
      throw Error(what + ": " + e.what());
    }
  }
  return rules;
}

// A part's name: its format with the pattern's groups put in (the match is
// the whole name, so $` and $' are empty).
std::string expand_part_name(const regex_detail::EcmaFormat& format, const std::vector<std::string>& groups) {
  std::string out;
  for (const auto& p : format.pieces()) {
    if (p.group == regex_detail::EcmaFormat::kBefore || p.group == regex_detail::EcmaFormat::kAfter) continue;
    const std::string& piece = p.group >= 0 ? groups[static_cast<size_t>(p.group)] : p.text;
    if (out.size() + piece.size() > kMaxPartNameBytes) throw Error("a part's name would be longer than 1048576 bytes");
    out += piece;
  }
  return out;
}

bool dense_rows(const SourceTensor& s) {
  int64_t expect = 1;
  for (size_t d = s.shape.size(); d-- > 0;) {
    if (s.shape[d] != 1 && s.strides[d] != expect) return false;
    expect *= s.shape[d];
  }
  return true;
}

void cut_parts(const SourceTensor& s, const FusedRule& rule, const std::vector<std::string>& groups,
               const WeightsOptions::FusedWeight& w, std::vector<SourceTensor>& out) {
  const std::string where = "weights '" + (s.file ? s.file->path() : std::string("?")) + "': tensor " +
                            regex_detail::shown(s.name) + ": " + rule_text(rule.pattern);
  if (s.shape.empty()) throw Error(where + ": a 0-dim tensor has no rows to cut");
  int64_t sum = 0;
  for (const auto& part : w.parts) sum += std::min(part.second, s.shape[0] + 1);  // no overflow, still unequal
  if (sum != s.shape[0]) {
    std::string rows;
    for (const auto& part : w.parts) rows += (rows.empty() ? "" : " + ") + std::to_string(part.second);
    throw Error(where + ": its parts' rows " + rows + " do not sum to its " + std::to_string(s.shape[0]) + " rows");
  }
  const int64_t element = static_cast<int64_t>(at::elementSize(s.dtype));
  const bool dense = dense_rows(s);
  int64_t offset = 0;
  for (size_t i = 0; i < w.parts.size(); ++i) {
    SourceTensor p = s;
    try {
      p.name = expand_part_name(rule.formats[i], groups);
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
    p.fused_from = s.name;
    p.shape[0] = w.parts[i].second;
    p.data = s.data + offset * s.strides[0] * element;
    if (dense) {  // pages to give back after the part is read
      p.begin = s.begin + static_cast<uint64_t>(offset * s.strides[0] * element);
      p.end = p.begin + static_cast<uint64_t>(p.shape[0] * s.strides[0] * element);
    }
    offset += w.parts[i].second;
    out.push_back(std::move(p));
  }
}

}  // namespace

std::vector<SourceTensor> split_fused(std::vector<SourceTensor> sources,
                                      const std::vector<WeightsOptions::FusedWeight>& fused) {
  if (fused.empty()) return sources;
  const auto rules = compile_fused(fused);
  std::vector<SourceTensor> out;
  for (auto& s : sources) {
    size_t hit = rules.size();
    std::vector<std::string> groups, g;
    for (size_t r = 0; r < rules.size(); ++r) {
      if (!rules[r]->re.full_match(s.name, &g)) continue;
      if (hit != rules.size())
        throw Error("weights '" + (s.file ? s.file->path() : std::string("?")) + "': tensor " + regex_detail::shown(s.name) +
                    " matches two WeightsOptions::fused rules, " + regex_detail::shown(rules[hit]->pattern) + " and " +
                    regex_detail::shown(rules[r]->pattern));
      hit = r;
      groups = g;
    }
    if (hit == rules.size())
      out.push_back(std::move(s));
    else
      cut_parts(s, *rules[hit], groups, fused[hit], out);
  }
  return out;
}

std::string shown_name(const SourceTensor& s) {
  return s.fused_from.empty() ? s.name : s.fused_from + " (part " + s.name + ")";
}

}  // namespace shardplan::weights_detail
