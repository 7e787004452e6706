#pragma once
// How the kernel's error messages write a shape: "[2, 3]". (The plan files,
// which build without torch for the fuzzer, keep theirs in plan_internal.h.)
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>

namespace shardplan {

inline std::string shape_str(c10::ArrayRef<int64_t> s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace shardplan
