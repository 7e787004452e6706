#pragma once
// Whole numbers given on a command line (--steps, --ranks, --batch, ...):
// the one parser of every example trainer, tool and benchmark. std::stoi
// reads "1e9" as 1 and "3x" as 3, and strtoull "-1" as 2^64 - 1, so a typo
// would run with another value and exit 0; here anything but the whole text
// as one number in range is refused, naming the option. Header-only and
// free of libtorch, for the torch-free `shardplan` and `shardplan-bench`.
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

namespace shardplan {

// The text as a whole number from lo to hi: decimal digits, a leading '-'
// only when lo < 0; no sign '+', spaces, exponent, suffix or overflow.
inline std::optional<long long> whole_number(const std::string& text, long long lo, long long hi) {
  const size_t digits_from = !text.empty() && text[0] == '-' && lo < 0 ? 1 : 0;
  if (text.size() == digits_from || text.size() > 20) return std::nullopt;
  for (size_t i = digits_from; i < text.size(); ++i)
    if (text[i] < '0' || text[i] > '9') return std::nullopt;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v < lo || v > hi) return std::nullopt;
  return v;
}

// What count_option throws: its message is the one line to print.
struct CountError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

inline std::string count_error(const std::string& option, const std::string& text, long long lo, long long hi) {
  return option + " must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got '" + text +
         "'";
}

// whole_number, or throws CountError "OPTION must be an integer from
// LO to HI, got 'TEXT'".
inline long long count_option(const std::string& option, const std::string& text, long long lo, long long hi) {
  if (auto v = whole_number(text, lo, hi)) return *v;
  throw CountError(count_error(option, text, lo, hi));
}

// whole_number, or, for a program with no usage error of its own (the
// benchmarks), "PROGRAM: OPTION must be ..." on stderr and exit status 2.
inline long long count_or_exit(const char* program, const std::string& option, const std::string& text, long long lo,
                               long long hi) {
  if (auto v = whole_number(text, lo, hi)) return *v;
  std::fprintf(stderr, "%s: %s\n", program, count_error(option, text, lo, hi).c_str());
  std::exit(2);
}

// count_option as an int, up to INT_MAX unless `hi` says less.
inline int count_option_int(const std::string& option, const std::string& text, int lo, int hi = INT_MAX) {
  return static_cast<int>(count_option(option, text, lo, hi));
}

}  // namespace shardplan
