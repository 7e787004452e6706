#include "base/env.h"

#include <cerrno>
#include <cstdlib>

#include "shardplan/error.h"

namespace shardplan::env {

const char* get(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

long long integer(const char* name, long long lo, long long hi, const char* what, long long fallback) {
  const char* v = get(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  // "5s" or "1e3" read as 5 and 1 by atoll would be a silent surprise.
  if (errno || end == v || *end || n < lo || n > hi)
    throw Error(std::string(name) + "='" + v + "' is not " + what + " (a whole number from " + std::to_string(lo) +
                " to " + std::to_string(hi) + ")");
  return n;
}

std::string choice(const char* name, std::initializer_list<const char*> choices, const char* fallback) {
  const char* v = get(name);
  if (!v) return fallback;
  std::string list;
  for (const char* c : choices) {
    if (std::string(v) == c) return v;
    list += (list.empty() ? "" : ", ") + std::string(c);
  }
  throw Error(std::string(name) + "='" + v + "' is not one of: " + list);
}

}  // namespace shardplan::env
