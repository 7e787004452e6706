#pragma once
// A communication group inside an autograd Function: contexts hold IValues,
// and the group outlives every graph that uses it (strategies own it), so
// its address travels as an integer.
#include <torch/autograd.h>

#include <cstdint>

#include "shardplan/communicator.h"

namespace shardplan {

inline int64_t group_handle(Communicator& g) { return reinterpret_cast<int64_t>(&g); }
inline Communicator& group_at(int64_t handle) { return *reinterpret_cast<Communicator*>(handle); }
// The group a forward stored as ctx->saved_data["group"].
inline Communicator& saved_group(torch::autograd::AutogradContext* ctx) {
  return group_at(ctx->saved_data["group"].toInt());
}

}  // namespace shardplan
