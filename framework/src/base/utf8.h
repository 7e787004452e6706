#pragma once
// UTF-8 validation for the YAML readers (plans, checkpoint metadata). Not
// installed.
#include <cstddef>
#include <cstdint>
#include <string>

namespace shardplan::detail {

// YAML text is UTF-8, and yaml-cpp writes any other byte sequence as U+FFFD:
// a name or key that is not UTF-8 would not survive being written back, so
// the readers refuse it. Strict: no overlong forms, no surrogates.
inline bool valid_utf8(const std::string& s) {
  static const uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07;
    else return false;
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < kMinForLength[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

}  // namespace shardplan::detail
