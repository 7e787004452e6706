#pragma once
// Data parallelism over a plan's batch axis, the way DDP and Megatron do it:
// each rank of a batch-axis group trains on its slice of the global batch,
// and after backward every gradient of a parameter replicated across that
// axis is averaged over it, so every rank steps with the gradient of the
// mean loss over the global batch. Gradients are packed into buckets in
// reverse registration order (roughly the order backward produces them);
// a hook on each parameter counts the gradients of its bucket, and the
// moment the last one arrives the bucket's all-reduce starts asynchronously
// on the batch axis' group, overlapping the rest of backward. When backward
// ends (a callback autograd's engine runs, as DDP's reducer does) the
// reductions are waited for and .grad holds the averages, so the training
// loop is PyTorch's: forward, backward, optimizer step. Model-axis
// collectives stay on their own groups; only this object talks to the batch
// axis' group.
//
// ZeRO-1 (`data_parallel: {zero: true}` in the plan): buckets are
// reduce-scattered instead, and a ZeroOptimizer steps the slices.
// shardplan::Optimizer (shardplan/optimizer.h) picks the right optimizer,
// and parallelize_for_training (shardplan/training.h) builds all of it in
// one call.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/communicator.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"

namespace torch {
namespace nn {
class Module;
}
namespace jit {
struct Module;
}
namespace optim {
class Optimizer;
}
}  // namespace torch

namespace shardplan {

class World;

struct GradBucket {
  std::vector<std::string> params;  // in packing order (reverse registration)
  int64_t numel = 0;                // gradient elements
  int64_t padded = 0;               // numel rounded up to a multiple of the batch-axis size
  at::ScalarType dtype = at::kFloat;
  int64_t element_size = 4;
  int64_t bytes() const { return numel * element_size; }
};

class DataParallel {
 public:
  // Not collective: the batch axis' group is the one parallelize created for
  // report.mesh. A plan without a batch axis gives a DataParallel of size 1
  // whose finish() does nothing, so a training loop can always build one.
  // Registers a gradient hook on every averaged parameter (removed by the
  // destructor); the model must outlive this object. Throws PlanError when
  // the batch axis is not in report.mesh. An `ignore` regex that matches no
  // parameter is a warning (warnings()).
  DataParallel(torch::nn::Module& model, const ParallelReport& report, const Plan& plan, World& world);
  // The same for a TorchScript module sharded by parallelize_script (its
  // ScriptParallel's module and report).
  DataParallel(torch::jit::Module& model, const ParallelReport& report, const Plan& plan, World& world);
  // The same over the parameters given, named as in the model: one pipeline
  // stage's (shardplan/pipeline.h), the rest of the model taking no part.
  // Throws PlanError for ZeRO-3, whose gates live in the layers.
  DataParallel(const std::vector<std::pair<std::string, at::Tensor>>& parameters, const ParallelReport& report,
               const Plan& plan, World& world);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  const std::string& axis() const;  // "" without a batch axis
  int size() const;                 // ranks along the batch axis (1 without)
  int rank() const;                 // this rank's coordinate on it
  bool zero() const;                // ZeRO stage >= 1: gradients reduce-scattered
  int zero_stage() const;           // data_parallel.zero: 0..3
  Communicator* group() const;      // nullptr without a batch axis

  // The rows of `global` (dim 0: the global batch) this rank trains on:
  // rows [rank * B/D, (rank + 1) * B/D), the same for every rank of one
  // model group. Throws naming the sizes when B is not a multiple of D.
  at::Tensor local_batch(const at::Tensor& global) const;
  // The mean of `local` over the batch axis (e.g. local mean losses give the
  // global batch's). Collective over the batch axis.
  double average(double local) const;
  // Each element's mean, in one all-reduce (element k gets the bits
  // average(local[k]) would at two ranks; at more, the backend's order).
  std::vector<double> average(const std::vector<double>& local) const;

  // Completes the averaging: starts any bucket not yet started, waits for
  // all, and leaves in every averaged parameter's .grad the mean over the
  // batch axis (ZeRO: the mean of this rank's slice, for its ZeroOptimizer).
  // Collective over the batch axis. The end of every backward outside
  // NoSync does this by itself, so it is needed only where no such backward
  // ran since the gradients last changed (all micro-batches under NoSync;
  // see also the limit below), and is a no-op otherwise.
  // That .grad holds its bucket's memory (DDP's gradient_as_bucket_view): it
  // may be read, clipped or zeroed in place until the next backward, which
  // replaces it; a reference kept across that backward sees the bucket reused.
  // Several backwards before one optimizer step accumulate as in one process.
  // Limit (DDP's too): a rank whose backward reaches none of the averaged
  // parameters has no hook to tell it a backward ran, so its peers wait for
  // it. shardplan::Optimizer's step() completes such a round; a loop with a
  // torch optimizer makes its peers time out with the communicator's error.
  void finish();

  // Gradient accumulation over micro-batches: backwards inside the scope
  // only accumulate into .grad locally; the next backward outside it starts
  // the reductions (of everything accumulated). Like DDP's no_sync(). A
  // torch optimizer stepping on gradients of NoSync backwards alone steps
  // on un-averaged gradients: finish() first, or use shardplan::Optimizer.
  class NoSync {
   public:
    explicit NoSync(DataParallel& dp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DataParallel& dp_;
  };

  // ZeRO-3 (`zero: 3`): between uses a parameter in a shardplan::nn layer
  // keeps its shape over a single NaN; this rank keeps its 1/D slice in its unit's bucket
  // (layout: shardplan/zero_optimizer.h, ZeroOptimizer::layout()). For the
  // scope's life every parameter is whole again, to read (evaluation
  // outside the layers, checkpoints, replica checks) or to write (loading
  // weights whole; load_weights(dp, ...) outside the scope loads only the
  // slices, weights.h): on leaving it, this rank's slices take the parameters' values
  // and they are freed again. Collective over the batch axis; a no-op below
  // stage 3. Not across a backward or an optimizer step. The parameters stay
  // free when the DataParallel is destroyed (a destructor cannot run a
  // collective): the model is usable only while it lives.
  class WholeParameters {
   public:
    explicit WholeParameters(const DataParallel& dp);
    ~WholeParameters();
    WholeParameters(const WholeParameters&) = delete;
    WholeParameters& operator=(const WholeParameters&) = delete;

   private:
    const DataParallel& dp_;
  };

  // ZeRO-3's parameter all-gathers since construction: how many, how many
  // a gate started ahead of their use (the next units in forward order, the
  // previous ones in backward, as many as fit twice the largest unit's
  // bytes, once the first step has shown the order), and
  // the seconds gates waited for them (what compute did not hide).
  // SHARDPLAN_ZERO3_PREFETCH=0 when a DataParallel is made turns its
  // prefetching off (for benchmarks: the wait is then the gathers' whole time).
  struct GatherStats {
    int64_t gathers = 0, prefetched = 0;
    double wait_seconds = 0;
    // The most units' whole parameters held or arriving at once, in bytes,
    // and the most gathers started ahead at once: what the prefetch window
    // (twice the largest unit) costs in memory.
    int64_t peak_whole_bytes = 0;
    int64_t most_in_flight = 0;
  };
  GatherStats gather_stats() const;

  // Opt-in consistency check, collective over every mesh axis: compares a
  // checksum of the bytes of each parameter that should be identical across
  // an axis' group (not split over it; for the batch axis, not ignored) and
  // throws shardplan::Error naming the first parameter that differs, the
  // axis and the ranks; every other rank throws too, naming the world rank
  // that found it (so no rank trains on while another stops). Under a
  // pipelined plan not over the pipe axis, whose stages hold different
  // parameters.
  void check_replicas() const;

  // The bucket plan and what is averaged.
  const std::vector<GradBucket>& buckets() const;
  const std::vector<std::string>& averaged() const;  // unique parameters, registration order
  const std::vector<std::string>& ignored() const;   // matched by data_parallel.ignore
  const std::vector<std::string>& split() const;     // split over the batch axis: no replicas to average
  const std::vector<std::string>& warnings() const;
  int64_t grad_bytes() const;         // bytes of the averaged gradients
  // Bytes this rank hands to collectives on the batch axis per step (the
  // Communicator's count: an all-reduce counts its buffer, a
  // reduce-scatter its input, an all-gather its input), and the bytes a
  // ring moves per rank on the wire, 2 (D-1)/D x the padded buckets' bytes,
  // which is the theoretical minimum of an all-reduce of grad_bytes().
  int64_t step_bytes() const;
  int64_t wire_bytes() const;
  int64_t min_wire_bytes() const;     // 2 (D-1)/D x grad_bytes()
  // Seconds the last finish() spent waiting for reductions (what backward
  // did not hide), for benchmarks.
  double last_wait_seconds() const;
  std::string describe() const;       // the bucket plan and the traffic, several lines

  struct Impl;
  struct GatedLayerInfo;
  // The state behind it (data_parallel_impl.h), for the framework's own
  // sources only (clip_grad.h reads the buckets).
  Impl& impl() const { return *impl_; }

 private:
  // Both kinds of model come here with their parameters by path (a tied
  // tensor under each of its paths), and ZeRO-3's gated layers.
  DataParallel(const std::vector<std::pair<std::string, at::Tensor>>& parameters, const ParallelReport& report,
               const Plan& plan, World& world, const std::vector<GatedLayerInfo>& layers);
  std::shared_ptr<Impl> impl_;
  friend class ZeroOptimizer;
  friend class Optimizer;
};

// Bytes of per-parameter state held by a torch optimizer (SGD momentum,
// Adam/AdamW moments, RMSprop, Adagrad), for reports.
int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer);

}  // namespace shardplan
