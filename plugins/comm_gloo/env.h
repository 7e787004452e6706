#pragma once
// The SHARDPLAN_GLOO_* environment variables (docs/ENVIRONMENT.md). Each is the
// default of an option, so a bad value is refused at create exactly as the
// option's would be: a typo must not silently fall back to the default.
#include <cstdlib>
#include <string>

#include "link.h"
#include "shm.h"
#include "tcp_all_reduce.h"

namespace sp_gloo {

// How long a rank waiting for a collective polls before it sleeps
// (WorkState::spin_first in shardplan/comm_worker.h), unless spin_us= or
// SHARDPLAN_GLOO_SPIN_US says; kSpinAuto: kDefaultSpinUs while this host has
// a core for each of its ranks, else 0 (default_spin_us in comm_gloo.cpp).
constexpr long kSpinAuto = -1;
constexpr long kDefaultSpinUs = 5000;
constexpr long kMaxSpinUs = 1000000;

// Defaults of the options shm=, tcp_all_reduce=, link_gbps= and spin_us=, from the environment.
struct EnvDefaults {
  ShmMode shm = ShmMode::kAuto;
  TcpAllReduce tcp_all_reduce = TcpAllReduce::kAuto;
  double link_gbps = 0;
  long spin_us = kSpinAuto;  // SHARDPLAN_GLOO_SPIN_US (option spin_us=)
  long test_stall_ms = 0;  // SHARDPLAN_TEST_GLOO_STALL_MS (Comm::test_stall)
  bool verbose = false;    // SHARDPLAN_GLOO_VERBOSE: each communicator's transport on stderr
  std::string bad;  // "NAME='VALUE' is not ...", or empty
};

// A whole number of at most 7 digits from 0 to `max`.
inline bool is_whole_number_up_to(const std::string& v, long max) {
  return !v.empty() && v.size() <= 7 && v.find_first_not_of("0123456789") == std::string::npos &&
         std::atol(v.c_str()) <= max;
}

// A test hook's pause: a whole number of milliseconds up to an hour, the
// range of SHARDPLAN_TEST_CKPT_PAUSE_MS (docs/ENVIRONMENT.md).
inline bool is_pause_ms(const std::string& v) { return is_whole_number_up_to(v, 3600000); }

inline bool parse_spin_us(const std::string& v, long& out) {
  if (!is_whole_number_up_to(v, kMaxSpinUs)) return false;
  out = std::atol(v.c_str());
  return true;
}
constexpr const char* kPauseMs = "a number of milliseconds (a whole number from 0 to 3600000)";

inline EnvDefaults env_defaults() {
  EnvDefaults d;
  // Worded as the library's own variables are (framework/src/base/env.h).
  auto refuse = [&](const char* name, const char* value, const char* what) {
    if (d.bad.empty()) d.bad = std::string(name) + "='" + value + "' is not " + what;
  };
  // Set but empty counts as unset, as for the other SHARDPLAN_* variables.
  if (const char* v = std::getenv("SHARDPLAN_GLOO_SHM"); v && *v && !parse_shm_mode(v, d.shm))
    refuse("SHARDPLAN_GLOO_SHM", v, "one of: auto, on, off, 1, 0, true, false (as option shm=)");
  if (const char* v = std::getenv("SHARDPLAN_GLOO_TCP_ALL_REDUCE");
      v && *v && !parse_tcp_all_reduce(v, d.tcp_all_reduce))
    refuse("SHARDPLAN_GLOO_TCP_ALL_REDUCE", v, "auto or ring (as option tcp_all_reduce=)");
  if (const char* v = std::getenv("SHARDPLAN_GLOO_LINK_GBPS"); v && *v && !parse_link_gbps(v, d.link_gbps))
    refuse("SHARDPLAN_GLOO_LINK_GBPS", v, "a link rate (a number of Gbit/s > 0, or 0 for no emulated link)");
  if (const char* v = std::getenv("SHARDPLAN_GLOO_SPIN_US"); v && *v && !parse_spin_us(v, d.spin_us))
    refuse("SHARDPLAN_GLOO_SPIN_US", v, "a number of microseconds (a whole number from 0 to 1000000, as option spin_us=)");
  if (const char* v = std::getenv("SHARDPLAN_GLOO_VERBOSE"); v && *v) {
    const std::string s = v;
    if (s == "1" || s == "0") d.verbose = s == "1";
    else refuse("SHARDPLAN_GLOO_VERBOSE", v, "0 or 1");
  }
  if (const char* v = std::getenv("SHARDPLAN_JOB_ID"); v && *v && !valid_job_id(v))
    refuse("SHARDPLAN_JOB_ID", v, "a job id (1 to 24 letters, digits, '_' or '.'; shardplan launch sets it)");
  if (const char* v = std::getenv("SHARDPLAN_TEST_GLOO_SHM_PAUSE_MS"); v && *v && !is_pause_ms(v))
    refuse("SHARDPLAN_TEST_GLOO_SHM_PAUSE_MS", v, kPauseMs);
  if (const char* v = std::getenv("SHARDPLAN_TEST_GLOO_STALL_MS"); v && *v) {
    if (is_pause_ms(v)) d.test_stall_ms = std::atol(v);
    else refuse("SHARDPLAN_TEST_GLOO_STALL_MS", v, kPauseMs);
  }
  return d;
}

}  // namespace sp_gloo
