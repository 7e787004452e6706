#pragma once
// Option values for the example drivers, parsed whole: std::stoi("1e9") is 1
// and std::stoi("12abc") 12, so a typo would train with another value. These
// throw std::invalid_argument for anything but the whole text as one number
// (std::out_of_range past the type), which the drivers report as a bad value
// of the option before anything runs. Counts (--steps, --ranks, ...) are
// shardplan::count_option's (shardplan/count_option.h), as in every tool.
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>

#include "shardplan/count_option.h"

namespace shardplan {
namespace examples {

// Seeds: strtoull would take "-1" as 2^64 - 1.
inline uint64_t option_seed(const std::string& text) {
  if (text.empty() || text[0] < '0' || text[0] > '9') throw std::invalid_argument(text);
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (*end != '\0') throw std::invalid_argument(text);
  if (errno == ERANGE) throw std::out_of_range(text);
  return v;
}

// A finite number (nan and inf are refused here, ranges by the driver).
inline double option_double(const std::string& text) {
  if (text.empty() || text.find_first_of(" \t\n") != std::string::npos) throw std::invalid_argument(text);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v)) throw std::invalid_argument(text);
  return v;
}

// --clip X: a positive finite norm (0 would zero every gradient); throws
// CountError with the line the drivers print (they print a CountError's
// message as it is).
inline double clip_option(const std::string& text) {
  double x = 0;
  try {
    x = option_double(text);
  } catch (const std::logic_error&) {
  }
  if (!(x > 0)) throw CountError("--clip takes a positive finite number (the largest gradient norm), got '" + text + "'");
  return x;
}

}  // namespace examples
}  // namespace shardplan
