#pragma once
// The example driver's loop for a plan with a `pipeline:` key
// (shardplan/pipeline.h): each rank of the pipe axis trains its stage's
// pieces, the plan's micro-batches going through its schedule, stepped by a
// shardplan::Optimizer over the stage's DataParallel (--micro-batches,
// --clip, half precision and --check-replicas as without a pipeline).
#include "models/train_rank.h"

namespace shardplan {
namespace examples {

// Trains r.m (sharded by r.plan over its other axes) for --steps. Throws
// shardplan::Error for a model that does not declare its pieces and for
// options the pipeline does not take yet, before any step.
void train_pipelined(TrainRank& r);

}  // namespace examples
}  // namespace shardplan
