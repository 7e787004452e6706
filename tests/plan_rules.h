#pragma once
// A plan's rules as one line each, for tests to compare whole plans:
// "fc1\.weight: [model, null] output=sharded".
#include <string>
#include <vector>

#include "shardplan/plan.h"

inline std::vector<std::string> rules_of(const shardplan::Plan& p) {
  std::vector<std::string> out;
  for (const auto& r : p.rules) {
    std::string s = r.pattern + ": " + shardplan::layout_str(r.layout);
    for (const auto& [k, v] : r.options) s += " " + k + "=" + v.value;
    out.push_back(s);
  }
  return out;
}
