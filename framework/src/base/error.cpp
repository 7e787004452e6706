#include "shardplan/error.h"

namespace shardplan {

std::string SourceLoc::str() const {
  // line == 0 means "somewhere in this file" (e.g. it could not be read).
  if (line == 0) return file;
  return file + ":" + std::to_string(line) + ":" + std::to_string(col);
}

PlanError::PlanError(const SourceLoc& loc, const std::string& message)
    : Error(loc.str().empty() ? message : loc.str() + ": " + message), loc_(loc), message_(message) {}

}  // namespace shardplan
