#pragma once
// A rank that runs each call through a comm plugin's C ABI, blocking, the
// way shardplan's Communicator does; send_recv is a ring exchange (send to
// rank+1, receive from rank-1) issued as two async operations.
#include <memory>
#include <string>
#include <vector>

#include "rank.h"
#include "shardplan/abi/comm.h"

namespace shardplan_bench {

struct PluginRankConfig {
  const sp_comm_api* api = nullptr;
  int rank = 0, size = 1;
  int32_t dtype = SP_FLOAT32;
  int64_t timeout_ms = 120000;
  const sp_store* store = nullptr;
  std::vector<std::string> options;  // key=value for the plugin
  int cuda_device = -1;              // >= 0: buffers live on this GPU
};

// Creates the communicator (a collective over all ranks); throws
// std::runtime_error with the plugin's message.
std::unique_ptr<Rank> make_plugin_rank(const PluginRankConfig& config);

// Makes the other ranks' pending calls fail instead of waiting for a rank
// that has failed (ranks that are threads of one process).
void abort_plugin_rank(Rank& rank);

}  // namespace shardplan_bench
