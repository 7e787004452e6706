#pragma once
// Which series a run measures and how each one's ranks are started: every
// plugin that can run here (or those --backends names) and the references
// (roofline, raw gloo, raw MPI) for all_reduce.
#include <string>
#include <vector>

#include "options.h"

namespace shardplan_bench {

struct Series {
  std::string name;     // the "backend" column: local, gloo, roofline, gloo-raw, ...
  std::string kind;     // plugin | roofline | gloo-raw | mpi-raw
  std::string launch;   // threads | procs | mpirun
  std::string plugin;   // library path for kind plugin
  std::vector<std::string> options;  // key=value given to the plugin's create (gloo-tcp: shm=off)
  bool cuda = false;    // buffers in GPU memory
  bool reference() const { return kind != "plugin"; }
  // "2 processes, CPU buffers, plugin /path/libshardplan_comm_gloo.so";
  // without the library path when `brief`.
  std::string describe(int ranks, bool brief = false) const;
};

struct Unavailable {
  std::string name, reason;
};

struct SeriesPlan {
  std::vector<Series> series;
  std::vector<Unavailable> unavailable;  // found or known, but cannot run here
};

// Throws UsageError when --backends or --refs names something that cannot run.
SeriesPlan plan_series(const Options& o);

// Absolute path of `program` (as given when it has a '/', else from $PATH);
// empty when not found.
std::string find_program(const std::string& program);

}  // namespace shardplan_bench
