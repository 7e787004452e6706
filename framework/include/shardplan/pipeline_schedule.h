#pragma once
// Pipeline schedules as data (docs/ARCHITECTURE.md, "Pipeline parallelism"):
// for every stage of a pipeline, the ordered list of what it does: forward
// or backward one micro-batch, send or receive an activation or a gradient.
// A pure function computes them, so tests check them without ranks, and
// simulate_schedule predicts their bubble; the Pipeline runtime
// (shardplan/pipeline.h) only walks its stage's list.
#include <string>
#include <vector>

namespace shardplan {

enum class PipelineOp { forward, backward, send_activation, recv_activation, send_gradient, recv_gradient };

struct PipelineAction {
  PipelineOp op = PipelineOp::forward;
  int micro = 0;  // the micro-batch
  int chunk = 0;  // this rank's model chunk (virtual stage); 0 unless interleaved
  int peer = -1;  // sends and receives: the other rank of the pipe group
  bool operator==(const PipelineAction& o) const {
    return op == o.op && micro == o.micro && chunk == o.chunk && peer == o.peer;
  }
};
std::string to_string(const PipelineAction& a);  // "F3", "B3.1" (chunk 1), "send_act 3 to 1"

// schedule[s]: stage s's actions in order. With interleaving, chunk c of
// rank s is model stage c * stages + s (Megatron's assignment).
using PipelineSchedule = std::vector<std::vector<PipelineAction>>;

// kind: gpipe, 1f1b or interleaved (virtual_stages >= 2, micro_batches a
// multiple of stages). Throws shardplan::Error on arguments it cannot
// schedule. A stage receives right before the compute that needs it and
// sends right after the compute that made it; sends never wait.
PipelineSchedule pipeline_schedule(const std::string& kind, int stages, int micro_batches, int virtual_stages = 1);

// The idle fraction of a step with uniform stages and free communication:
// (p - 1) / (m + p - 1) for gpipe and 1f1b, (p - 1) / (v m + p - 1) for
// interleaved (the bubble divided by v, as Megatron's paper puts it).
double pipeline_bubble(const std::string& kind, int stages, int micro_batches, int virtual_stages = 1);

struct ScheduleSimulation {
  double makespan = 0;              // when the last stage finishes
  std::vector<double> busy;         // per stage: time spent in forward and backward
  std::vector<int> peak_in_flight;  // per stage: most micro-batch chunks forwarded and not yet backwarded
  double bubble() const;            // 1 - (sum of busy) / (stages x makespan)
};

// Runs the lists against each other as the runtime would: a send is posted
// at once, a receive waits for the matching send, and messages between two
// stages of one kind (activations, gradients) arrive in the order sent.
// Throws shardplan::Error naming the stage and action for a deadlock, a
// receive that gets another micro-batch than it expects, a backward before
// its forward, a send never received, or a micro-batch chunk not forwarded
// and backwarded exactly once. Times are per chunk.
ScheduleSimulation simulate_schedule(const PipelineSchedule& schedule, double forward_time = 1,
                                     double backward_time = 2);

}  // namespace shardplan
