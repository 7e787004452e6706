#pragma once
// Pipeline parallelism (docs/ARCHITECTURE.md and docs/PLAN_FORMAT.md,
// "Pipeline parallelism"): a model lists its pieces in the order its forward
// runs them, the plan's `pipeline:` key gives each rank of the pipe axis a
// contiguous run of them (its stage), and Pipeline runs a schedule
// (shardplan/pipeline_schedule.h) on this rank: activations forward and
// their gradients back by point-to-point messages over the pipe group.
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/communicator.h"
#include "shardplan/data_parallel.h"
#include "shardplan/parallelize.h"
#include "shardplan/pipeline_schedule.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace shardplan {

class RngTracker;

// What a model implements to be cut into stages: its pieces in order, each
// named by the module paths (named_modules() keys) whose parameters it
// uses, and one piece's forward. Piece 0 takes the batch input; each next
// one takes the previous piece's output; the last returns what the loss
// takes. Every parameter of the model must be under one piece's modules.
class PipelineModel {
 public:
  virtual ~PipelineModel() = default;
  virtual std::vector<std::vector<std::string>> pieces() const = 0;
  virtual at::Tensor forward_piece(size_t index, const at::Tensor& input) = 0;
};

// A torch::nn::Sequential as pieces: one per child, in order.
class SequentialPipeline : public PipelineModel {
 public:
  explicit SequentialPipeline(torch::nn::Sequential sequential);
  std::vector<std::vector<std::string>> pieces() const override;
  at::Tensor forward_piece(size_t index, const at::Tensor& input) override;

 private:
  torch::nn::Sequential sequential_;
};

// For each stage, the pieces it runs: [first, second). From the spec's
// patterns (every piece in exactly one stage, stages in the model's order;
// a PlanError at the pattern's file:line:col names the module otherwise) or,
// for `stages: auto`, contiguous runs whose largest parameter count is as
// small as it can be. piece_params[i]: the parameters (elements) of piece i.
using StageRanges = std::vector<std::pair<size_t, size_t>>;
StageRanges assign_stages(const std::vector<std::vector<std::string>>& pieces, const std::vector<int64_t>& piece_params,
                          const PipelineSpec& spec, int stages);

// What one step did on this rank (Pipeline::stats()), for the benchmarks
// (docs/BENCHMARKS.md, "Pipeline parallelism"). Times are wall-clock seconds
// on this rank's thread; step_s - compute_s is its idle time, the bubble
// plus the waits.
struct PipelineStats {
  // The schedule's run, the tied gradients' sum and the loss broadcast
  // included (a batch axis' gradient reduction after it not).
  double step_s = 0;
  double forward_s = 0;   // in the pieces' forwards
  double backward_s = 0;  // in autograd's backward (and the loss, on the last stage)
  double compute_s() const { return forward_s + backward_s; }
  // In point-to-point calls: blocked in receives, posting sends, and waiting
  // for this step's sends to complete at its end.
  double wait_s = 0;
  // The activations and gradients this rank sent to and received from the
  // other stages, payload only (the shape header a chunk's first
  // micro-batch carries, 80 bytes, is not counted); with m micro-batches and
  // activations of A bytes, a middle stage sends and receives m x A per
  // direction and chunk.
  int64_t bytes_sent = 0, bytes_received = 0;
  // Micro-batch chunks forwarded and not yet backwarded, at most at once:
  // m for GPipe, at most p - stage for 1F1B.
  int peak_in_flight = 0;
  // The bytes of the in-flight chunks' inputs (received activations; none on
  // model stage 0, which slices the batch) and outputs (what the chunk's last
  // piece returned), at most at once. What a stage keeps for backward, up to
  // the tensors autograd saves inside the pieces (proportional to them for
  // uniform blocks); counted as each tensor's numel x element size.
  int64_t peak_activation_bytes = 0;
};

// What `stages: {auto: time}` balances: each piece's forward time on the
// first of `micro_batches` slices of `sample` along dim 0, the median of
// three runs after a warm-up, in nanoseconds, the largest over the world's
// ranks (collective: every rank gets the same). `model` is put in eval mode
// and back, so no dropout draws from the generators.
std::vector<int64_t> time_pieces(torch::nn::Module& model, PipelineModel& pieces, const at::Tensor& sample,
                                 int micro_batches, World& world);

class Pipeline {
 public:
  // output: what the last piece returned for one micro-batch; target: that
  // micro-batch's slice of the target. Returns the micro-batch's mean loss.
  using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

  // `model` owns the parameters `pieces` names (often the same object).
  // Collective over the world (the pipe groups are made here). With a batch
  // axis in the plan, `report` is parallelize()'s for `model` and this
  // stage's gradients are averaged over that axis (a DataParallel over this
  // stage's parameters). Throws PlanError for a plan without `pipeline:` or
  // stages that do not fit the model, Error for a model whose pieces leave a
  // parameter out or a batch axis without a report. `stages: {auto: time}`
  // needs `sample`, a batch input as step() takes: each piece's forward is
  // timed on its first micro-batch (the model in eval mode, without
  // gradients) on every rank, and the slowest rank's times are balanced,
  // so every rank cuts alike.
  Pipeline(torch::nn::Module& model, PipelineModel& pieces, const Plan& plan, World& world,
           const ParallelReport* report = nullptr, const at::Tensor& sample = at::Tensor());
  ~Pipeline();

  const std::string& axis() const { return axis_; }  // the pipe axis
  int stage() const { return stage_; }    // this rank's coordinate on the pipe axis
  int stages() const { return stages_; }  // the pipe axis' size
  // Per chunk of this rank (one unless interleaved), its pieces.
  const StageRanges& chunks() const { return chunks_; }
  const PipelineSchedule& schedule() const { return schedule_; }
  // This rank's parameters, named as in the whole model (a tied tensor once,
  // under its first path here): what its optimizer steps. The others stay
  // in the module but take no part. A tensor tied between pieces of several
  // stages (an LM head sharing the embedding) is kept by each of them, and
  // step() sums its gradient over the pipe group (Megatron's embedding
  // group), so the copies stay equal.
  const std::vector<std::pair<std::string, at::Tensor>>& named_parameters() const { return params_; }
  std::vector<at::Tensor> parameters() const;
  // The model's other parameters are released to the zero page at
  // construction (shardplan/nn/deferred_init.h), keeping their shapes: a
  // rank's parameter memory is its stage's (resident_parameter_bytes).

  // For checkpoints (shardplan/pipeline_checkpoint.h): the model's pieces,
  // and whether this rank saves one of its named_parameters(): a tensor tied
  // across stages is saved by the first stage that keeps it.
  const PipelineModel& model_pieces() const { return pieces_; }
  bool saves(const at::Tensor& parameter) const;

  // One step's forwards and backwards over micro_batches slices of input
  // and target along dim 0 (with a batch axis, of this data rank's slice of
  // them). Gradients accumulate into this stage's parameters' .grad as those
  // of the mean loss over the whole batch (averaged over the batch axis);
  // the loss (that mean) is returned on every rank. Inside a
  // DataParallel::NoSync over data_parallel() the batch axis' reduction
  // waits for the first step outside one (gradient accumulation over steps).
  double step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss);
  // The last step()'s figures on this rank (zeros before the first).
  const PipelineStats& stats() const { return stats_; }
  // The batch axis' DataParallel over this stage's parameters, or nullptr.
  DataParallel* data_parallel() const { return dp_.get(); }

 private:
  struct Slot;  // one micro-batch chunk's tensors
  double run_schedule(const at::Tensor& input, const at::Tensor& target, const LossFn& loss);
  // rank_of_piece[i]: the pipe rank that runs piece i.
  void keep_parameters(torch::nn::Module& model, const std::vector<std::vector<std::string>>& pieces,
                       const std::vector<int>& rank_of_piece);
  // `before`: per tied tensor, its .grad before this step (undefined: none).
  void sum_tied_gradients(const std::vector<at::Tensor>& before);
  void forward(const PipelineAction& a, Slot& slot, const at::Tensor& micro_input);
  void backward(const PipelineAction& a, Slot& slot, const at::Tensor& micro_target, const LossFn& loss);
  void send_gradient(Slot& slot, int peer);
  // `header`: micro-batch 0's activation, whose shape and dtype go first.
  void send(const at::Tensor& t, int peer, int tag, bool header);
  at::Tensor recv(int peer, int tag, int chunk, bool header);
  at::Tensor recv_like(const at::Tensor& output, int peer);
  int model_stage(int chunk) const { return chunk * stages_ + stage_; }
  bool last_model_stage(int chunk) const { return model_stage(chunk) == stages_ * virtual_ - 1; }

  PipelineModel& pieces_;
  std::string axis_;
  std::shared_ptr<Communicator> group_;
  int stage_ = 0, stages_ = 1, virtual_ = 1, micro_ = 1;
  StageRanges chunks_;
  PipelineSchedule schedule_;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  // Per chunk, the shape and dtype its incoming activations were agreed on
  // (by micro-batch 0's header).
  std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> shapes_;
  at::Tensor loss_sum_;                         // this step's, on the last model stage
  // Tensors tied across ranks' stages, in tied_parameters() order (every
  // rank alike), and whether this rank keeps it.
  std::vector<std::pair<at::Tensor, bool>> tied_;
  std::vector<const void*> saved_elsewhere_;  // TensorImpls this rank keeps that an earlier stage saves
  std::unique_ptr<DataParallel> dp_;
  std::vector<std::unique_ptr<Work>> pending_;  // this step's sends (each keeps its tensor)
  // Past stage 0: the thread's RNG tracker with the seed offset by the
  // stage (made from `stage_rng_base_`), what this stage's dropout draws from.
  std::shared_ptr<RngTracker> stage_rng_;
  const RngTracker* stage_rng_base_ = nullptr;
  std::shared_ptr<RngTracker> stage_rng();
  PipelineStats stats_;
  int in_flight_ = 0;
  int64_t live_bytes_ = 0;  // the in-flight chunks' inputs and outputs
};

}  // namespace shardplan
