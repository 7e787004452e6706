#pragma once
// The opt-in per-call communication trace (SHARDPLAN_COMM_TRACE=DIR): each
// rank writes DIR/rank<N>.jsonl, one JSON line per collective with when it
// was issued, when the caller began to wait for it and when it completed, so
// a step's timeline can be laid next to another program's
// (benchmarks/gpt_peer/timeline_summary.py reads it; docs/BENCHMARKS.md,
// "Where the time goes over TCP"). Off, a Communicator holds a null pointer
// and each call pays one branch.
//
// Lines (times in µs since this process's first trace, steady clock):
//   {"meta":"comm_trace","rank":0,"world_size":2,"backend":"gloo","origin_unix_us":...}
//   {"op":"step","step":3,"t":12.5}
//   {"op":"all_reduce","group":"model","step":3,"async":false,"bytes":4096,"dtype":"float32",
//    "t_issue":13.0,"t_wait_begin":13.0,"t_done":40.2}
// A synchronous call's caller waits from its issue; an asynchronous one's
// from its Work::wait() (or the done() that first saw it finished), and its
// line also has "t_issue_end", when the issuing call returned (a backend
// that blocks at issue shows there). A Work dropped unfinished has
// "t_wait_begin" and "t_done" null.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

namespace shardplan {

// One call as the trace keeps it until it completes.
struct TracedCall {
  const char* op = "";
  std::string group;
  int step = 0;
  bool async = false;
  uint64_t bytes = 0;
  int32_t dtype = 0;
  double t_issue = 0;
  double t_issue_end = -1;  // asynchronous: when the issuing call returned
};

class CommTrace {
 public:
  // The trace $SHARDPLAN_COMM_TRACE asks for, or nullptr when it is unset.
  // DIR is created if missing (one level); anything that cannot take
  // DIR/rank<rank>.jsonl is an Error naming the variable.
  static std::shared_ptr<CommTrace> from_env(int rank, int world_size, const std::string& backend);
  CommTrace(const std::string& dir, int rank, int world_size, const std::string& backend);
  ~CommTrace();  // writes what is buffered
  CommTrace(const CommTrace&) = delete;
  CommTrace& operator=(const CommTrace&) = delete;

  // µs since the process's origin.
  static double now_us();
  // A call about to be issued by this rank, stamped now.
  TracedCall begin(const char* op, const std::string& group, bool async, uint64_t bytes, int32_t dtype) const;
  void record(const TracedCall& call, double t_wait_begin, double t_done);
  void record_abandoned(const TracedCall& call);
  // Marks the start of training step `step`; later calls carry it.
  void step(int step);
  const std::string& path() const { return path_; }

  // Text kept in memory before it is written out: past kFlushAt a step
  // marker writes it (outside any call), past kHardLimit the record itself.
  static constexpr size_t kFlushAt = size_t(1) << 20;
  static constexpr size_t kHardLimit = size_t(8) << 20;

 private:
  void append(const std::string& line);
  void flush_locked();

  std::string path_;
  std::FILE* file_ = nullptr;
  std::mutex mu_;
  std::string buffer_;
  std::atomic<int> step_{0};
};

}  // namespace shardplan
