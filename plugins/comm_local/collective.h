#pragma once
// One collective, from publishing this rank's slot to the exit barrier; the
// caller decides which thread runs it.
#include <string>

#include "group.h"
#include "shardplan/abi/comm.h"

namespace sp_local {

int run_collective(Comm* c, const Desc& d, std::string& msg, sp_comm** split_out);

}  // namespace sp_local
