#include "models/train_pipeline.h"

#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "models/schedule.h"
#include "models/train_step.h"
#include "shardplan/clip_grad.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
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
      {a.clip > 0 && r.plan.data_parallel.zero > 0, "--clip under data_parallel.zero"},
      {a.micro_batches > 1, "--micro-batches (the plan's pipeline.micro_batches cuts the batch)"},
      {!a.master.empty() || a.loss_scale, "half precision (--dtype bfloat16/float16)"},
      {a.generate > 0 || !a.dump_logits.empty() || !a.save_weights.empty(),
       "--generate, --dump-logits and --save-weights"},
  };
  for (const auto& [refused, what] : missing)
    if (refused) throw Error(what + ": not yet with a plan's pipeline: key (" + a.plan + ")");
  const int micro = r.plan.pipeline.micro_batches;
  const std::string batch_axis = r.plan.batch_axis();
  const int data = batch_axis.empty() ? 1 : r.report.mesh.axis_size(batch_axis);
  if (a.batch % (data * micro) != 0)
    throw Error("--batch " + std::to_string(a.batch) + " does not divide into " + std::to_string(data) +
                " data rank(s) x the " + std::to_string(micro) + " micro-batches of " + a.plan + "'s pipeline: key");
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

}  // namespace

void train_pipelined(TrainRank& r) {
  const Args& a = r.a;
  refuse_what_is_not_there_yet(r);
  auto* pieces = dynamic_cast<PipelineModel*>(r.m.module.get());
  if (!pieces)
    throw Error("model " + a.model + " does not declare its pieces (shardplan::PipelineModel), which a plan's " +
                "pipeline: key needs; gpt does");
  Pipeline pipe(*r.m.module, *pieces, r.plan, r.world, &r.report);
  print_stages(r, pipe);
  // With a batch axis the stage's DataParallel: shardplan::Optimizer (ZeRO-1
  // and 2 included) steps on its averaged gradients.
  std::unique_ptr<Optimizer> averaged;
  std::unique_ptr<torch::optim::Optimizer> plain;
  if (DataParallel* dp = pipe.data_parallel())
    averaged = make_optimizer(a, *dp);
  else
    plain = make_torch_optimizer(a, pipe.parameters());
  torch::optim::Optimizer& inner = averaged ? averaged->inner() : *plain;
  Schedule schedule(schedule_settings(a));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(a.seed + 1);  // as train_loop.cpp's: the same batches
  TrainCheckpoints checkpoints(r, pipe, averaged.get(), plain.get(), schedule);
  const int start = checkpoints.resume(gen);
  ExampleModel& model = *r.m.model;
  const Pipeline::LossFn loss = [&model](const at::Tensor& out, const at::Tensor& target) {
    return model.output_loss(out, target);
  };
  r.m.module->train();
  r.world.reset_stats();
  StepLog log(r, start);
  for (int step = start; step <= a.steps; ++step) {
    Batch batch = model.sample(gen, a.batch, r.corpus);
    if (batch.input.is_floating_point()) batch.input = batch.input.to(r.dtype);
    if (averaged)
      averaged->zero_grad();
    else
      plain->zero_grad();
    StepResult s;
    s.loss = pipe.step(batch.input, batch.target, loss);
    if (a.clip > 0) s.norm = clip_grad_norm_(pipe, r.report, r.world, a.clip);
    s.lr = schedule.apply(inner);
    if (averaged)
      averaged->step();
    else
      plain->step();
    schedule.advance();
    s.comm = r.world.total_stats();
    log.after_step(step, s);
    checkpoints.maybe_save(step);
  }
}

}  // namespace examples
}  // namespace shardplan
