#pragma once

namespace shardplan_bench {

// `shardplan bench comm`: argv[0] is "comm". Returns the exit status.
int comm_main(int argc, char** argv);

}  // namespace shardplan_bench
