#pragma once
// Checkpoints of a pipelined model (docs/CHECKPOINTS.md, "Pipelines"), in
// the format of shardplan/checkpoint.h's sharded checkpoints: each stage's
// ranks write the pieces of that stage's parameters, buffers and optimizer
// state (a tensor tied across stages, an LM head sharing the embedding, by
// the first stage that keeps it), so the checkpoint is the one the whole
// model would have written. It loads at any pipe, model and data size, or
// unsharded with checkpoint.h's load_checkpoint; and one saved without a
// pipeline loads into a pipelined run. Each rank reads its stage's tensors.
#include <map>
#include <string>

#include "shardplan/checkpoint.h"
#include "shardplan/pipeline.h"

namespace shardplan {

// Collective over the world, like save_checkpoint: `model` and `report` are
// those the Pipeline was built over (the report parallelize() returned, or
// a default one without tensor parallelism). options.optimizer steps
// pipe.parameters() (or options.zero: the stage's ZeRO-1 over the data axis).
void save_checkpoint(const std::string& dir, const Pipeline& pipe, torch::nn::Module& model,
                     const ParallelReport& report, World& world, const CheckpointOptions& options = {});

// Loads this rank's stage of any sharded checkpoint of the model (pipelined
// or not); the other stages' tensors are not read. As load_checkpoint: a
// checkpoint that does not fit (a tensor missing, a shape that disagrees)
// is one error naming the tensor, and nothing changes on any rank.
std::map<std::string, std::string> load_checkpoint(const std::string& dir, const Pipeline& pipe,
                                                   torch::nn::Module& model, const ParallelReport& report,
                                                   World& world, const CheckpointOptions& options = {});

}  // namespace shardplan
