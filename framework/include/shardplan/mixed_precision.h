#pragma once
// Mixed-precision training (docs/TRAINING_NUMERICS.md): a model in bfloat16
// or float16 whose optimizer steps float32 master weights, with gradients
// accumulated in float32, and float16's dynamic loss scaling. Pass a
// MixedPrecision to shardplan::Optimizer (shardplan/optimizer.h):
//   model->to(at::kBFloat16);                      // before parallelize
//   auto t = shardplan::parallelize_for_training(*model, plan, *world);
//   shardplan::MixedPrecision mp;
//   mp.master_dtype = at::kFloat;                  // float32 masters
//   shardplan::Optimizer opt(*t.data_parallel, make_adam, mp);
//   opt.zero_grad();
//   opt.scale_loss(loss).backward();                // loss itself without a scaler
//   opt.step();                                     // skipped when a gradient was inf/NaN (with a scaler)
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace shardplan {

// "float32", "bfloat16", "float16", "float64" (and "float", "half", "double",
// "bf16", "fp16", "fp32") as a dtype. Throws shardplan::Error naming `what`
// (e.g. "--dtype") and the accepted names otherwise.
at::ScalarType dtype_from_name(const std::string& name, const std::string& what);

// torch.cuda.amp.GradScaler's defaults.
struct LossScalerOptions {
  double init_scale = 65536.0;   // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // good steps in a row before the scale grows
};

// Dynamic loss scaling as GradScaler does it: the loss is multiplied by the
// scale before backward; a step whose gradients hold an inf or NaN is
// skipped and the scale multiplied by backoff_factor; after growth_interval
// good steps in a row it is multiplied by growth_factor. shardplan::Optimizer
// owns one (MixedPrecision::loss_scaler) and makes the skip decision the
// same on every rank; this class alone is the arithmetic and the state.
class LossScaler {
 public:
  // Throws shardplan::Error naming the option when it is not finite and
  // positive (init_scale), > 1 (growth_factor), in (0, 1) (backoff_factor)
  // or >= 1 (growth_interval).
  explicit LossScaler(const LossScalerOptions& options = {});
  double scale() const { return scale_; }
  int64_t growth_tracker() const { return tracker_; }
  const LossScalerOptions& options() const { return options_; }
  // loss * scale(), in the loss' dtype.
  at::Tensor scale_loss(const at::Tensor& loss) const;
  // After a step: backs off when found_inf, else counts a good step.
  void update(bool found_inf);
  // The state as checkpoint attributes: {"loss_scale": "65536",
  // "loss_scale_growth_tracker": "0"} (exact: the scale is printed with
  // every digit). load_state takes a map holding them (other keys are
  // ignored; none of them: nothing changes) and throws shardplan::Error
  // naming the key for a value that is not a valid state, changing nothing.
  std::map<std::string, std::string> state() const;
  void load_state(const std::map<std::string, std::string>& attributes);

  static constexpr const char* kScaleKey = "loss_scale";
  static constexpr const char* kTrackerKey = "loss_scale_growth_tracker";

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t tracker_ = 0;
};

// What shardplan::Optimizer keeps beyond the model's own dtype.
struct MixedPrecision {
  // The dtype of the weights the torch optimizer steps (master weights) and
  // of the gradient accumulation: when a trainable parameter has another
  // dtype, the optimizer keeps a copy of every parameter in this dtype,
  // gradients accumulate in it across micro-batches and backwards (in the
  // DataParallel's buckets, which the batch axis reduces), and after each
  // step the model's parameters are the masters rounded. Unset, or equal to
  // the model's dtype: no copies, the model's parameters are stepped.
  std::optional<at::ScalarType> master_dtype;
  // Dynamic loss scaling; required when a trainable parameter is float16.
  std::optional<LossScalerOptions> loss_scaler;
};

// What a trainer's `--dtype MODEL --master MASTER` ask for: masters in
// `master` when it differs from `model`, and a loss scaler with
// GradScaler's defaults when `model` is float16. E.g. (bfloat16, float32):
// masters; (bfloat16, bfloat16): pure bfloat16; (float32, float32): nothing.
MixedPrecision mixed_precision_for(at::ScalarType model, at::ScalarType master);

}  // namespace shardplan
