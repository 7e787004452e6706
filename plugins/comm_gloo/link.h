#pragma once
// An emulated slower link, for benchmarks: with `link_gbps=X` (or
// SHARDPLAN_GLOO_LINK_GBPS=X) every operation takes at least the time its
// bytes need at X Gbit/s, counted as the bytes each rank sends in the
// ring/tree algorithm of that operation (all_reduce 2(n-1)/n of the buffer,
// all_gather and reduce_scatter (n-1)/n, ...). The rest of that time is
// slept on the communicator's worker, where a real network would keep the
// NIC busy and the CPU free; so a same-host run can show how much of a
// cross-host sync a training step hides (docs/BENCHMARKS.md, bench_dp_step).
// It is not a network model: no latency, no sharing between communicators.
//
// An operation whose bytes need longer than the communicator's timeout fails
// at issue, on every rank alike, with a timeout error naming the link and
// the limit (link_refusal), as it would on a real link that slow, only
// without the wait. The rate is not refused at create: whether it is too
// slow depends on the size of each operation, which only the operation
// knows, and a slow link is legitimate for small messages. So no sleep
// outlasts the timeout, and an abort cuts a sleep short.
#include <atomic>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <thread>

namespace sp_gloo {

// x > 0: Gbit/s; 0: no emulated link. False for anything else.
inline bool parse_link_gbps(const std::string& v, double& out) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x) || x < 0) return false;
  out = x;
  return true;
}

// The bytes a rank sends for `op` over `size` ranks, from the byte sizes of
// the buffers submit_collective() queues (for a rooted collective's
// non-root rank both are its own block).
inline double link_bytes(const char* op, int size, double send, double recv) {
  if (size <= 1) return 0;
  const double n = size, share = (n - 1) / n;
  if (!std::strcmp(op, "all_reduce")) return 2 * share * recv;
  if (!std::strcmp(op, "all_gather")) return share * recv;
  if (!std::strcmp(op, "reduce_scatter") || !std::strcmp(op, "all_to_all")) return share * send;
  if (!std::strcmp(op, "broadcast")) return recv;
  if (!std::strcmp(op, "scatter")) return (n - 1) * recv;  // the root's, which every rank waits for
  if (!std::strcmp(op, "gather")) return (n - 1) * send;
  if (!std::strcmp(op, "send") || !std::strcmp(op, "recv")) return send;
  return 0;
}

// Seconds `op` needs at `bytes_per_second` (0: no emulated link).
inline double link_seconds(double bytes_per_second, const char* op, int size, double send, double recv) {
  return bytes_per_second > 0 ? link_bytes(op, size, send, recv) / bytes_per_second : 0;
}

// Empty when the emulated link moves an operation within `timeout`, else why
// not (the message of a timeout error).
inline std::string link_refusal(double seconds, double bytes_per_second, std::chrono::milliseconds timeout) {
  if (seconds * 1000 <= static_cast<double>(timeout.count())) return {};
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "timed out: the emulated link of %g Gbit/s (option link_gbps, SHARDPLAN_GLOO_LINK_GBPS) needs %.3g s "
                "for this operation's %.0f bytes, past the communicator's timeout of %lld ms",
                bytes_per_second * 8 / 1e9, seconds, seconds * bytes_per_second,
                static_cast<long long>(timeout.count()));
  return buf;
}

// Holds the operation it is declared in to at least `seconds`, unless that
// operation fails or the communicator is aborted.
class LinkPace {
 public:
  LinkPace(double seconds, const std::atomic<bool>& aborted)
      : seconds_(seconds), aborted_(aborted), start_(std::chrono::steady_clock::now()) {}
  ~LinkPace() {
    if (seconds_ <= 0 || std::uncaught_exceptions() != 0) return;
    const auto until = start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(seconds_));
    while (!aborted_.load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_until(std::min(until, std::chrono::steady_clock::now() + std::chrono::milliseconds(50)));
  }
  LinkPace(const LinkPace&) = delete;
  LinkPace& operator=(const LinkPace&) = delete;

 private:
  double seconds_;
  const std::atomic<bool>& aborted_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace sp_gloo
