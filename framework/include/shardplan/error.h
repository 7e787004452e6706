#pragma once
// Errors users see. Every message is one line and names where the problem is:
// a plan's file:line:col, a parameter path, a plugin file, or a collective.
#include <stdexcept>
#include <string>

namespace shardplan {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Where in a plan file something was written (1-based line and column).
struct SourceLoc {
  std::string file;
  int line = 0;
  int col = 0;
  std::string str() const;  // "file:line:col", or just "file" when line == 0
};

// A plan that cannot be used. what() is "file:line:col: message".
class PlanError : public Error {
 public:
  PlanError(const SourceLoc& loc, const std::string& message);
  const SourceLoc& loc() const { return loc_; }
  const std::string& message() const { return message_; }

 private:
  SourceLoc loc_;
  std::string message_;
};

// A plugin that cannot be loaded or used. what() names the library path.
class PluginError : public Error {
 public:
  using Error::Error;
};

// A collective that failed, timed out or was aborted. what() names the
// collective and the group.
class CommError : public Error {
 public:
  CommError(const std::string& message, int status) : Error(message), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

}  // namespace shardplan
