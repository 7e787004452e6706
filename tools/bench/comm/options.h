#pragma once
// Command line of `shardplan bench comm`, shared by the coordinator (what the
// user typed) and its workers (the same sweep, plus where they stand).
#include <cstdint>
#include <string>
#include <vector>

#include "collective.h"

namespace shardplan_bench {

struct SweepOptions {
  std::vector<Collective> collectives = all_collectives();
  uint64_t min_bytes = 8;
  uint64_t max_bytes = uint64_t(256) << 20;
  double factor = 2;
  int iters = 20;
  int warmup = 5;
  int32_t dtype = 0;  // SP_FLOAT32
  bool check = false;
  int64_t timeout_ms = 120000;

  // min_bytes, min_bytes * factor, ... up to max_bytes.
  std::vector<uint64_t> sizes() const;
};

// Set only in a worker process: which series it runs and how it was started.
struct WorkerOptions {
  std::string series;   // "local", "gloo", "roofline", "gloo-raw", ...
  std::string kind;     // plugin | roofline | gloo-raw | mpi-raw
  std::string launch;   // threads | procs | mpirun
  std::string plugin;   // library path, for kind plugin
  std::vector<std::string> plugin_options;  // key=value for the plugin's create (--worker-option)
  bool cuda = false;    // buffers in GPU memory
  std::string dir;      // private directory of this series (stores)
  int rank = -1;        // procs only; mpirun ranks read their environment
};

struct Options {
  SweepOptions sweep;
  std::vector<std::string> backends;  // empty: every available one
  bool refs_given = false;
  std::vector<std::string> refs;      // roofline, gloo-raw, mpi-raw
  int ranks = 2;
  std::string csv, json, plot;
  std::vector<std::string> plugin_dirs;
  std::string mpirun = "mpirun";
  bool list = false;                  // --list: print what is available, run nothing
  bool worker = false;
  WorkerOptions w;
};

extern const char* const kUsage;

// Throws UsageError with a one-line message.
Options parse_options(int argc, char** argv);

struct UsageError {
  std::string message;
};

// "8", "8B", "4KiB", "4K", "256MiB", "1GiB" -> bytes; false when malformed.
bool parse_bytes(const std::string& text, uint64_t* bytes);
// 8 -> "8 B", 4096 -> "4 KiB", 3145728 -> "3 MiB", 1536 -> "1.5 KiB".
std::string human_bytes(uint64_t bytes);
// float32, float64, float16, bfloat16, int8, uint8, int32, int64 (and the
// aliases float, double, half, bf16, int, long); false when unknown.
bool parse_dtype(const std::string& name, int32_t* dtype);

// argv of a worker for the same sweep (without the program and "comm").
std::vector<std::string> worker_args(const Options& o, const WorkerOptions& w);

}  // namespace shardplan_bench
