#pragma once
// Plan errors in tests: a plan's text parsed as p.yaml, and the check that
// its error is one line starting at an exact file:line:col.
#include <gtest/gtest.h>

#include <string>

#include "shardplan/error.h"
#include "shardplan/plan.h"

namespace plan_errors {

// The PlanError parsing `yaml` as p.yaml gives, or "<no error>".
inline std::string error_of(const std::string& yaml) {
  try {
    shardplan::parse_plan(yaml, "p.yaml");
  } catch (const shardplan::PlanError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace plan_errors

// The message starts with the exact location and contains `text`.
#define EXPECT_PLAN_ERROR(yaml, line, col, text)                                                      \
  do {                                                                                                \
    const std::string what_ = plan_errors::error_of(yaml);                                            \
    const std::string where_ = "p.yaml:" + std::to_string(line) + ":" + std::to_string(col) + ": ";   \
    EXPECT_EQ(what_.rfind(where_, 0), 0u) << "expected at " << where_ << "\n got: " << what_;         \
    EXPECT_NE(what_.find(text), std::string::npos) << "expected '" << (text) << "'\n got: " << what_; \
    EXPECT_EQ(what_.find('\n'), std::string::npos) << "multi-line: " << what_;                        \
  } while (0)
