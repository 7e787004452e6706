// WeightsOptions/SaveWeightsOptions::transposed (weights.h): tensors a file
// keeps [in, out], as GPT-2's Conv1D does. Loading swaps the source's shape
// and strides, so every later step (shape checks, shard cuts, ZeRO-3 slices,
// dtype conversion) sees the parameter's layout and copies from a strided
// view of the file: no transposed copy of a whole tensor is ever made.
#include <ATen/ATen.h>

#include <utility>

#include "base/ecma_regex.h"
#include "base/shape_text.h"
#include "shardplan/error.h"
#include "weights/weights_internal.h"

namespace shardplan {
namespace weights_detail {
struct TransposedNames::Pattern {
  explicit Pattern(const std::string& p) : text(p), re(p, kNamePatternMemory) {}
  std::string text;
  regex_detail::EcmaRegex re;
};

TransposedNames::TransposedNames(const std::vector<std::string>& patterns) {
  check_pattern_count(patterns.size(), "transposed", "patterns");
  for (const auto& p : patterns) {
    try {
      patterns_.push_back(std::make_unique<Pattern>(p));
    } catch (const regex_detail::RegexError& e) {
      throw Error("transposed: pattern " + regex_detail::shown(p) + ": " + e.what());
    }
  }
}

TransposedNames::~TransposedNames() = default;

const std::string* TransposedNames::match(const std::string& name) const {
  for (const auto& p : patterns_)
    if (p->re.full_match(name)) return &p->text;
  return nullptr;
}

void transpose_sources(std::vector<SourceTensor>& sources, const std::vector<std::string>& patterns,
                       const std::string& path) {
  if (patterns.empty()) return;
  const TransposedNames names(patterns);
  for (auto& s : sources) {
    const std::string* pattern = names.match(s.name);
    if (!pattern) continue;
    if (s.shape.size() != 2)
      throw Error("weights '" + (s.file ? s.file->path() : path) + "': tensor '" + escaped(shown_name(s)) + "' has shape " +
                  shape_str(s.shape) + ", but WeightsOptions::transposed " + regex_detail::shown(*pattern) +
                  " names it: only a 2-D [in, out] tensor is stored transposed");
    std::swap(s.shape[0], s.shape[1]);
    std::swap(s.strides[0], s.strides[1]);
    s.transposed = true;
  }
}

}  // namespace weights_detail
}  // namespace shardplan
