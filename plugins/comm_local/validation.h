#pragma once
// Argument checks, local (each rank its own, before the entry barrier) and the
// words that describe a slot when ranks disagree after it.
#include <cstdint>
#include <string>

#include "group.h"
#include "shardplan/abi/comm.h"

namespace sp_local {

struct Local {
  int err = SP_OK;
  std::string why;
  int dtype = 0;
  uint64_t count = 0;
};

Local validate(const Desc& d, int n, int rank);
std::string describe_slot(const Slot& s);
Local validate_p2p(const Desc& d, int n);

}  // namespace sp_local
