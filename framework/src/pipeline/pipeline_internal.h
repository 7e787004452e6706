#pragma once
// Shared by pipeline.cpp (setting a Pipeline up) and pipeline_step.cpp (running one).
#include "shardplan/pipeline.h"

namespace shardplan {

struct Pipeline::Slot {
  at::Tensor input;   // what the chunk's first piece took (past model stage 0, a leaf requiring grad)
  at::Tensor output;  // what its last piece returned; released once its backward ran
  at::Tensor grad;    // the gradient of `output` from the next stage
};

}  // namespace shardplan
