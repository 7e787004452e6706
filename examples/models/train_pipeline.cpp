#include "models/train_pipeline.h"

#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/schedule.h"
#include "models/train_step.h"
#include "shardplan/clip_grad.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/mixed_precision.h"
#include "shardplan/nn/deferred_init.h"
#include "shardplan/optimizer.h"
#include "shardplan/pipeline.h"

namespace shardplan {
namespace examples {
namespace {

// What the pipelined loop does not do yet (issue 36's next steps), refused
// before anything runs rather than ignored.
void refuse_what_is_not_there_yet(const TrainRank& r) {
  const Args& a = r.a;
  const std::vector<std::pair<bool, std::string>> missing = {
      {a.clip > 0 && a.clip_with_torch, "--clip-with torch"},
      {a.generate > 0 || !a.dump_logits.empty() || !a.save_weights.empty(),
       "--generate, --dump-logits and --save-weights"},
  };
  for (const auto& [refused, what] : missing)
    if (refused) throw Error(what + ": not yet with a plan's pipeline: key (" + a.plan + ")");
  const int micro = r.plan.pipeline.micro_batches;
  const std::string batch_axis = r.plan.batch_axis();
  const int data = batch_axis.empty() ? 1 : r.report.mesh.axis_size(batch_axis);
  if (a.batch % (a.micro_batches * data * micro) != 0)
    throw PlanError(r.plan.pipeline.micro_batches_loc,
                    "--batch " + std::to_string(a.batch) + " does not divide into " + std::to_string(a.micro_batches) +
                        " --micro-batches x " + std::to_string(data) + " data rank(s) x these " +
                        std::to_string(micro) + " micro_batches");
}

void print_stages(const TrainRank& r, const Pipeline& pipe) {
  const PipelineSpec& spec = r.plan.pipeline;
  if (r.lead())
    std::printf("pipeline: %d stages over '%s', schedule %s, %d micro-batches, predicted bubble %.3f\n", pipe.stages(),
                spec.axis.c_str(), spec.schedule.c_str(), spec.micro_batches,
                pipeline_bubble(spec.schedule, pipe.stages(), spec.micro_batches, spec.virtual_stages));
  int64_t params = 0;
  for (const auto& p : pipe.named_parameters()) params += p.second.numel();
  // The other stages' parameters were released (Pipeline): what it holds.
  const int64_t held = nn::resident_parameter_bytes(*r.m.module);
  in_rank_order(r.world, [&] {
    std::string pieces;
    for (const auto& [first, end] : pipe.chunks())
      pieces += (pieces.empty() ? "" : ", ") + std::to_string(first) + "-" + std::to_string(end - 1);
    std::printf("rank %d: stage %d, pieces %s, %lld parameters (%lld bytes held)\n", r.world.rank(), pipe.stage(),
                pieces.c_str(), static_cast<long long>(params), static_cast<long long>(held));
  });
}

// --micro-batches K: K pipeline steps on batch/K each, their gradients
// accumulated, the batch axis reduced once after the last (one process's
// gradient accumulation); then the optimizer step as train_step's.
StepResult pipelined_step(const TrainRank& r, Pipeline& pipe, DataParallel& dp, Optimizer& opt, Schedule& schedule,
                          Batch batch) {
  const int k_steps = r.a.micro_batches;
  if (batch.input.is_floating_point()) batch.input = batch.input.to(r.dtype);
  opt.zero_grad();
  StepResult s;
  // A dynamic scale is a power of two: the loss divides back exactly.
  const double scale = opt.loss_scaler() ? opt.loss_scaler()->scale() : 1.0;
  ExampleModel& model = *r.m.model;
  const Pipeline::LossFn loss = [&](const at::Tensor& out, const at::Tensor& target) {
    at::Tensor l = model.output_loss(out, target);
    return opt.scale_loss(k_steps > 1 ? l / k_steps : l);
  };
  {
    DataParallel::NoSync accumulate(dp);
    const int64_t n = batch.input.size(0) / k_steps;
    for (int k = 0; k < k_steps; ++k)
      s.loss += pipe.step(batch.input.narrow(0, k * n, n), batch.target.narrow(0, k * n, n), loss);
  }
  dp.finish();
  s.loss /= scale;
  s.lr = schedule.apply(opt.inner());
  // The norm over every stage of what the optimizer steps with (ZeRO's
  // slices, float32 masters), unscaled first.
  if (r.a.clip > 0) s.norm = clip_grad_norm_(opt, r.a.clip);
  s.scale = scale;
  opt.step();
  s.skipped = opt.last_step_skipped();
  if (!s.skipped) schedule.advance();
  s.comm = r.world.total_stats();
  return s;
}

}  // namespace

void train_pipelined(TrainRank& r) {
  const Args& a = r.a;
  refuse_what_is_not_there_yet(r);
  auto* pieces = dynamic_cast<PipelineModel*>(r.m.module.get());
  if (!pieces)
    throw PlanError(r.plan.pipeline.loc, "pipeline: model " + a.model +
                                             " does not declare its pieces (shardplan::PipelineModel), which a "
                                             "pipeline needs; gpt and llama do");
  // stages: {auto: time} times the pieces on a batch drawn from a
  // generator of its own, so the run's batches stay the same.
  at::Tensor sample;
  if (r.plan.pipeline.balance == "time") {
    auto probe = at::make_generator<at::CPUGeneratorImpl>(a.seed + 1);
    sample = r.m.model->sample(probe, a.batch, r.corpus).input;
    if (sample.is_floating_point()) sample = sample.to(r.dtype);
  }
  Pipeline pipe(*r.m.module, *pieces, r.plan, r.world, &r.report, sample);
  print_stages(r, pipe);
  // shardplan::Optimizer over the stage's DataParallel (the batch axis'
  // when the plan has one, ZeRO-1 and 2 included; else one of size 1), so
  // that masters, the loss scaler and clipping are the unpipelined loop's.
  std::unique_ptr<DataParallel> own;
  if (!pipe.data_parallel()) own = std::make_unique<DataParallel>(pipe.named_parameters(), r.report, r.plan, r.world);
  DataParallel& dp = own ? *own : *pipe.data_parallel();
  const std::unique_ptr<Optimizer> opt = make_optimizer(a, dp);
  Schedule schedule(schedule_settings(a));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(a.seed + 1);  // as train_loop.cpp's: the same batches
  TrainCheckpoints checkpoints(r, pipe, *opt, schedule);
  const int start = checkpoints.resume(gen);
  r.m.module->train();
  r.world.reset_stats();
  StepLog log(r, start);
  for (int step = start; step <= a.steps; ++step) {
    const StepResult s = pipelined_step(r, pipe, dp, *opt, schedule, r.m.model->sample(gen, a.batch, r.corpus));
    // Within each stage: its model ranks' and data ranks' replicas.
    if (a.check_replicas > 0 && step % a.check_replicas == 0) check_replicas_at(step, dp);
    log.after_step(step, s);
    checkpoints.maybe_save(step);
  }
}

}  // namespace examples
}  // namespace shardplan
