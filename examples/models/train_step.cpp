// One step of the example driver and its log line (models/train_step.h).
#include "models/train_step.h"

#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "models/out_of_memory.h"
#include "shardplan/clip_grad.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/tied.h"

namespace shardplan {
namespace examples {
namespace {

std::string stem(const std::string& path) {
  std::string base = path.substr(path.find_last_of('/') + 1);
  return base.substr(0, base.find('.'));
}

// --clip after the gradients are averaged, before the step: the norm of
// what the optimizer steps with (ZeRO-1: its reduced slices), every element
// of the unsharded model counted once; --clip-with torch: torch's over this
// rank's own parameters (a tied tensor once, as PyTorch's parameters()).
double clip(const TrainRank& r, Optimizer& opt) {
  if (r.a.clip_with_torch) return torch::nn::utils::clip_grad_norm_(unique_parameters(*r.m.module), r.a.clip);
  return clip_grad_norm_(opt, r.a.clip);
}

// The micro-batches' forwards and backwards; this rank's summed loss.
double forward_backward(const TrainRank& r, DataParallel& dp, Optimizer& opt, Batch batch) {
  const int n = r.a.micro_batches;
  if (batch.input.is_floating_point()) batch.input = batch.input.to(r.dtype);
  const at::Tensor input = dp.local_batch(batch.input), target = dp.local_batch(batch.target);
  const int64_t micro = input.size(0) / n;
  opt.zero_grad();
  double local_loss = 0;
  for (int k = 0; k < n; ++k) {
    Batch mb{input.narrow(0, k * micro, micro), target.narrow(0, k * micro, micro)};
    at::Tensor loss = r.m.model->loss(mb);
    if (n > 1) loss = loss / n;
    local_loss += loss.item<double>();
    if (k + 1 < n) {
      DataParallel::NoSync no_sync(dp);
      opt.scale_loss(loss).backward();
    } else {
      opt.scale_loss(loss).backward();
    }
  }
  dp.finish();
  return local_loss;
}

}  // namespace

StepResult train_step(const TrainRank& r, DataParallel& dp, Optimizer& opt, Schedule& schedule, Batch batch,
                      int step) {
  const std::string of_step = "step " + std::to_string(step) + "'s ";
  const double local_loss = naming_out_of_memory(
      of_step + "forward and backward (activations, gradients" +
          (dp.zero_stage() >= 3 ? ", gathered parameters)" : ")"),
      [&] { return forward_backward(r, dp, opt, std::move(batch)); });
  StepResult out;
  out.lr = schedule.apply(opt.inner());
  if (r.a.clip > 0) out.norm = clip(r, opt);
  if (LossScaler* scaler = opt.loss_scaler()) out.scale = scaler->scale();
  naming_out_of_memory(of_step + "optimizer step (the optimizer's state)", [&] { opt.step(); });
  out.skipped = opt.last_step_skipped();
  // Megatron's: a step the loss scaler skipped does not move the schedule.
  if (!out.skipped) schedule.advance();
  out.comm = r.world.total_stats();
  out.loss = std::nan("");
  out.local_loss = local_loss;
  return out;
}

void check_replicas_at(int step, const DataParallel& dp) {
  try {
    dp.check_replicas();
  } catch (const Error& e) {
    throw Error("step " + std::to_string(step) + ": " + e.what());
  }
}

StepLog::StepLog(const TrainRank& r, int start, const DataParallel* dp)
    : r_(r),
      dp_(dp),
      start_(start),
      items_(r.a.batch * r.m.model->items_per_sample()),
      own_plan_(stem(r.a.plan) == r.a.model),
      minimum_(own_plan_ ? r.m.model->min_comm_bytes(r.a.batch, r.world.size(), dtype_bytes(r.a.dtype))
                         : -1),
      since_(std::chrono::steady_clock::now()),
      since_step_(start - 1) {}

void StepLog::first_step_communication(const CommStats& first) const {
  if (!r_.lead() || r_.world.size() == 1) return;
  std::printf("communicated in step 1 (forward + backward) on rank 0: %llu bytes in %llu calls; ",
              static_cast<unsigned long long>(first.bytes), static_cast<unsigned long long>(first.calls));
  if (minimum_ >= 0)
    std::printf("theoretical minimum for plans/%s.yaml: %lld bytes\n", r_.a.model.c_str(),
                static_cast<long long>(minimum_));
  else if (own_plan_)
    std::printf("the model states no minimum\n");
  else
    std::printf("no stated minimum for this plan (the model states one for plans/%s.yaml only)\n",
                r_.a.model.c_str());
}

void StepLog::after_step(int step, const StepResult& s) {
  const Args& a = r_.a;
  if (step == start_) first_step_communication(s.comm);
  const bool line = step % a.log_every == 0 || step == start_ || step == a.steps;
  double loss = s.loss;
  if (!std::isnan(s.local_loss)) {
    local_sum_ += s.local_loss;
    if (!line) return;
    // The printed loss is the bits dp.average(local_loss) gives; the mean
    // differs from a sum of per-step averages in rounding only.
    const std::vector<double> both =
        dp_ ? dp_->average(std::vector<double>{s.local_loss, local_sum_}) : std::vector<double>{s.local_loss, local_sum_};
    loss = both[0];
    loss_sum_ = both[1];
    local_sum_ = 0;
  } else {
    loss_sum_ += s.loss;
  }
  if (!r_.lead() || !line) return;
  const auto now = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(now - since_).count();
  const double rate = (step - since_step_) * static_cast<double>(items_) / std::max(secs, 1e-9);
  // One batch's loss is noisy; the mean since the last line shows the trend.
  // float64 runs are compared with an unsharded run to 1e-10 and better.
  std::printf("step %4d  loss %.*f", step, r_.dtype == at::kDouble ? 12 : 8, loss);
  if (a.clip > 0) std::printf("  norm %.12e", s.norm);
  if (a.loss_scale) std::printf("  scale %g%s", s.scale, s.skipped ? " (skipped: an inf/NaN gradient)" : "");
  std::printf("  mean %.4f  %s/s %.0f  lr %.3e\n", loss_sum_ / (step - since_step_), r_.m.model->items_name().c_str(),
              rate, s.lr);
  std::fflush(stdout);
  since_ = now;
  since_step_ = step;
  loss_sum_ = 0;
}

}  // namespace examples
}  // namespace shardplan
