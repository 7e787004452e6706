// Reading SHARDPLAN_* and the launchers' environment variables with the
// same strictness as the options they stand for: a typo in a variable is an
// error naming it, never a silent default (docs/ENVIRONMENT.md lists them).
#pragma once

#include <initializer_list>
#include <string>

namespace shardplan::env {

// The value, or nullptr when unset or empty (an empty variable means unset,
// as `${X:-default}` in a shell).
const char* get(const char* name);

// A whole number from lo to hi, or `fallback` when unset. Throws Error:
// "NAME='v' is not <what> (a whole number from lo to hi)".
long long integer(const char* name, long long lo, long long hi, const char* what, long long fallback);

// One of `choices`, or `fallback` when unset. Throws Error:
// "NAME='v' is not one of: a, b".
std::string choice(const char* name, std::initializer_list<const char*> choices, const char* fallback);

}  // namespace shardplan::env
