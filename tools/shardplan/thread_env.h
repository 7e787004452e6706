#pragma once
// The CPU threads each rank of a node gets, as environment variables: like
// torchrun's OMP_NUM_THREADS, but the cores shared out among the node's ranks
// rather than one each, and for the BLAS pool too (OpenBLAS reads its own
// variable when it loads; libtorch's OMP_NUM_THREADS does not reach it).
#include <string>
#include <utility>
#include <vector>

namespace shardplan_cli {

// SHARDPLAN_NUM_THREADS, OMP_NUM_THREADS and OPENBLAS_NUM_THREADS for one of
// `ranks_per_node` ranks, each only when the launcher's own environment does
// not set it. The value is $SHARDPLAN_NUM_THREADS when set, else
// max(1, cores the launcher may use / ranks_per_node).
std::vector<std::pair<std::string, std::string>> thread_environment(int ranks_per_node);

}  // namespace shardplan_cli
