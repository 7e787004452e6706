#pragma once
// WeightsOptions::rename, compiled once per load (rename.cpp). Not installed.
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace shardplan::weights_detail {

class Renames {
 public:
  // Throws Error naming the first rule that is refused.
  explicit Renames(const std::vector<std::pair<std::string, std::string>>& rules);
  ~Renames();
  // `name` after every rule, in order. Throws Error naming `file`, the
  // tensor and the rule when a rule cannot rename it within the bounds.
  std::string apply(const std::string& name, const std::string& file) const;

 private:
  struct Rule;
  std::vector<std::unique_ptr<Rule>> rules_;
};

}  // namespace shardplan::weights_detail
