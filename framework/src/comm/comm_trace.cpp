#include "comm/comm_trace.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "base/env.h"
#include "shardplan/comm_dtype.h"
#include "shardplan/error.h"

namespace shardplan {

namespace {

using Clock = std::chrono::steady_clock;

// One origin per process, so that thread ranks' files share a time axis.
Clock::time_point origin() {
  static const Clock::time_point t = Clock::now();
  return t;
}

// The wall-clock time of the origin, so that files of different processes
// can be laid on one axis (to the clocks' agreement).
double origin_unix_us() {
  static const double t = [] {
    const auto steady_since = Clock::now() - origin();
    const auto wall = std::chrono::system_clock::now() - steady_since;
    return std::chrono::duration<double, std::micro>(wall.time_since_epoch()).count();
  }();
  return t;
}

// Group names are ours or a plan's axis names; escape what JSON needs anyway.
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string trace_error(const std::string& dir, const std::string& why) {
  return "SHARDPLAN_COMM_TRACE='" + dir + "' " + why + " (it names a directory that gets one rank<N>.jsonl per rank)";
}

}  // namespace

std::shared_ptr<CommTrace> CommTrace::from_env(int rank, int world_size, const std::string& backend) {
  const char* dir = env::get("SHARDPLAN_COMM_TRACE");
  if (!dir) return nullptr;
  return std::make_shared<CommTrace>(dir, rank, world_size, backend);
}

CommTrace::CommTrace(const std::string& dir, int rank, int world_size, const std::string& backend) {
  struct stat st {};
  // Several ranks may create it at once: EEXIST is theirs, not an error.
  if (::stat(dir.c_str(), &st) != 0 && ::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
    throw Error(trace_error(dir, std::string("cannot be created: ") + std::strerror(errno)));
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) throw Error(trace_error(dir, "is not a directory"));
  path_ = dir + "/rank" + std::to_string(rank) + ".jsonl";
  file_ = std::fopen(path_.c_str(), "w");
  if (!file_) throw Error(trace_error(dir, "cannot take " + path_ + ": " + std::strerror(errno)));
  origin();
  char line[256];
  std::snprintf(line, sizeof line,
                "{\"meta\":\"comm_trace\",\"rank\":%d,\"world_size\":%d,\"backend\":%s,\"origin_unix_us\":%.1f}\n", rank,
                world_size, json_string(backend).c_str(), origin_unix_us());
  buffer_ = line;
}

CommTrace::~CommTrace() {
  std::lock_guard<std::mutex> lock(mu_);
  flush_locked();
  std::fclose(file_);
}

double CommTrace::now_us() { return std::chrono::duration<double, std::micro>(Clock::now() - origin()).count(); }

TracedCall CommTrace::begin(const char* op, const std::string& group, bool async, uint64_t bytes,
                            int32_t dtype) const {
  TracedCall c;
  c.op = op;
  c.group = group;
  c.step = step_.load(std::memory_order_relaxed);
  c.async = async;
  c.bytes = bytes;
  c.dtype = dtype;
  c.t_issue = now_us();
  return c;
}

namespace {

// What every call's line starts with: {"op":..,"group":..,"step":..,"async":..,"bytes":..,"dtype":..,"t_issue":..
std::string trace_line_start(const TracedCall& c) {
  char fields[160];
  std::snprintf(fields, sizeof fields, ",\"step\":%d,\"async\":%s,\"bytes\":%llu,\"dtype\":\"%s\",\"t_issue\":%.1f", c.step,
                c.async ? "true" : "false", static_cast<unsigned long long>(c.bytes), comm::dtype_name(c.dtype),
                c.t_issue);
  return std::string("{\"op\":\"") + c.op + "\",\"group\":" + json_string(c.group) + fields;
}

}  // namespace

void CommTrace::record(const TracedCall& c, double t_wait_begin, double t_done) {
  char issue_end[48] = "";
  if (c.t_issue_end >= 0) std::snprintf(issue_end, sizeof issue_end, ",\"t_issue_end\":%.1f", c.t_issue_end);
  char rest[128];
  std::snprintf(rest, sizeof rest, "%s,\"t_wait_begin\":%.1f,\"t_done\":%.1f}\n", issue_end, t_wait_begin, t_done);
  append(trace_line_start(c) + rest);
}

void CommTrace::record_abandoned(const TracedCall& c) {
  append(trace_line_start(c) + ",\"t_wait_begin\":null,\"t_done\":null}\n");
}

void CommTrace::step(int step) {
  std::lock_guard<std::mutex> lock(mu_);
  // Written before the marker is stamped, so the write falls between steps.
  if (buffer_.size() >= kFlushAt) flush_locked();
  step_.store(step, std::memory_order_relaxed);
  char line[80];
  std::snprintf(line, sizeof line, "{\"op\":\"step\",\"step\":%d,\"t\":%.1f}\n", step, now_us());
  buffer_ += line;
}

void CommTrace::append(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  buffer_ += line;
  if (buffer_.size() >= kHardLimit) flush_locked();
}

void CommTrace::flush_locked() {
  if (buffer_.empty()) return;
  // A full disk loses the trace, not the training run.
  std::fwrite(buffer_.data(), 1, buffer_.size(), file_);
  std::fflush(file_);
  buffer_.clear();
}

}  // namespace shardplan
