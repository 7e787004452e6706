#pragma once
// A plugin's all_reduce against the library under it, measured in the same
// processes with blocks of calls alternating between the two (plugin, raw,
// raw, plugin, ...), each block after a barrier. Load that comes and goes on
// a shared machine then falls on both sides of a pair alike, which running
// one series after the other (`shardplan bench comm`) cannot promise. Used by
// benchmarks/comm_gloo and benchmarks/comm_mpi; each brings its raw side and
// its way of starting ranks.
#include <cstddef>
#include <string>
#include <vector>

#include "shardplan/abi/comm.h"

namespace shardplan_bench {

// One way of reducing: the plugin through the C ABI, or the raw library.
class ReduceSide {
 public:
  virtual ~ReduceSide() = default;
  // float32 sum over all ranks, in place.
  virtual void all_reduce(float* data, size_t n) = 0;
  virtual void barrier() = 0;
};

// The plugin side: a communicator of `api` (rank, size, options as given).
// Throws with the plugin's message when it cannot be created.
class PluginReduceSide final : public ReduceSide {
 public:
  PluginReduceSide(const sp_comm_api* api, int rank, int size, int64_t timeout_ms,
                   const std::vector<std::string>& options);
  ~PluginReduceSide() override;
  PluginReduceSide(const PluginReduceSide&) = delete;
  PluginReduceSide& operator=(const PluginReduceSide&) = delete;

  void all_reduce(float* data, size_t n) override;
  void barrier() override;

 private:
  const sp_comm_api* api_;
  sp_comm* comm_ = nullptr;
};

struct InterleavedOptions {
  int rank = 0;
  int size = 1;
  int scale = 1;                       // multiplies the blocks per size
  size_t min_bytes = 4096;              // sizes min, 4 min, 16 min, ...
  size_t max_bytes = size_t(64) << 20;  // ... up to this
  std::string tested_name = "plugin";  // column heading of the tested side
  std::string raw_name = "raw";        // ... and of the reference
  std::string title;                   // first line of the table
};

// The command line both benchmarks share: --scale S, --min-bytes B,
// --max-bytes B, --plugin PATH, --control, and --ranks N where the program
// starts its own ranks (`ranks` non-null). Fills what it is given; false on
// anything else or an out-of-range value (a count that is not a whole number
// in range also says so in `why`, naming the option).
struct InterleavedArgs {
  InterleavedOptions options;
  bool control = false;  // time the raw library against itself
  std::string plugin;
};
bool parse_interleaved_args(int argc, char** argv, InterleavedArgs& args, int* ranks = nullptr,
                            std::string* why = nullptr);

// Checks both sides' sums, then measures every size; rank 0 prints the table
// (median µs per call of each side, GB/s, and the median over neighbouring
// block pairs of raw time / tested time). Throws on a wrong sum.
void run_interleaved(ReduceSide& tested, ReduceSide& raw, const InterleavedOptions& o);

}  // namespace shardplan_bench
