#pragma once
// The SHARDPLAN_GLOO_* environment variables (docs/ENV_GLOO.md). Each is the
// default of an option, so a bad value is refused at create exactly as the
// option's would be: a typo must not silently fall back to the default.
#include <cstdlib>
#include <string>

#include "link.h"
#include "shm.h"

namespace sp_gloo {

// Defaults of the options shm= and link_gbps=, from the environment.
struct EnvDefaults {
  ShmMode shm = ShmMode::kAuto;
  double link_gbps = 0;
  long test_stall_ms = 0;  // SHARDPLAN_TEST_GLOO_STALL_MS (Comm::test_stall)
  std::string bad;  // "bad environment variable NAME=VALUE (expected ...)", or empty
};

// Digits only, at most 9 of them.
inline bool is_count(const std::string& v) {
  return !v.empty() && v.size() <= 9 && v.find_first_not_of("0123456789") == std::string::npos;
}

inline EnvDefaults env_defaults() {
  EnvDefaults d;
  auto refuse = [&](const char* name, const char* value, const char* expected) {
    if (d.bad.empty()) d.bad = std::string("bad environment variable ") + name + "=" + value + " (expected " + expected + ")";
  };
  // Set but empty counts as unset, as for the other SHARDPLAN_* variables.
  if (const char* v = std::getenv("SHARDPLAN_GLOO_SHM"); v && *v && !parse_shm_mode(v, d.shm))
    refuse("SHARDPLAN_GLOO_SHM", v, "auto, on or off; 1/true for on, 0/false for off");
  if (const char* v = std::getenv("SHARDPLAN_GLOO_LINK_GBPS"); v && *v && !parse_link_gbps(v, d.link_gbps))
    refuse("SHARDPLAN_GLOO_LINK_GBPS", v, "a number of Gbit/s > 0, or 0 for no emulated link");
  if (const char* v = std::getenv("SHARDPLAN_JOB_ID"); v && *v && !valid_job_id(v))
    refuse("SHARDPLAN_JOB_ID", v, "1 to 24 letters, digits, '_' or '.'; set by shardplan launch");
  if (const char* v = std::getenv("SHARDPLAN_TEST_GLOO_SHM_PAUSE_MS"); v && *v && !is_count(v))
    refuse("SHARDPLAN_TEST_GLOO_SHM_PAUSE_MS", v, "a number of milliseconds >= 0; a test hook");
  if (const char* v = std::getenv("SHARDPLAN_TEST_GLOO_STALL_MS"); v && *v) {
    if (is_count(v)) d.test_stall_ms = std::atol(v);
    else refuse("SHARDPLAN_TEST_GLOO_STALL_MS", v, "a number of milliseconds >= 0; a test hook");
  }
  return d;
}

}  // namespace sp_gloo
