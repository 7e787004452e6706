// Dynamic loss scaling (shardplan/mixed_precision.h), GradScaler's rule.
#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>

#include "shardplan/error.h"
#include "shardplan/mixed_precision.h"

namespace shardplan {

at::ScalarType dtype_from_name(const std::string& name, const std::string& what) {
  static const std::map<std::string, at::ScalarType> kNames = {
      {"float32", at::kFloat},  {"float", at::kFloat},     {"fp32", at::kFloat},      {"bfloat16", at::kBFloat16},
      {"bf16", at::kBFloat16},  {"float16", at::kHalf},    {"half", at::kHalf},       {"fp16", at::kHalf},
      {"float64", at::kDouble}, {"double", at::kDouble},   {"fp64", at::kDouble}};
  const auto it = kNames.find(name);
  if (it == kNames.end())
    throw Error(what + ": unknown dtype '" + name + "' (expected float32, bfloat16, float16 or float64)");
  return it->second;
}

MixedPrecision mixed_precision_for(at::ScalarType model, at::ScalarType master) {
  MixedPrecision mp;
  if (master != model) mp.master_dtype = master;
  if (model == at::kHalf) mp.loss_scaler = LossScalerOptions{};
  return mp;
}

LossScaler::LossScaler(const LossScalerOptions& options) : options_(options), scale_(options.init_scale) {
  auto bad = [](const char* name, double v, const char* want) {
    throw Error(std::string("LossScalerOptions::") + name + " must be " + want + ", got " + std::to_string(v));
  };
  if (!std::isfinite(options.init_scale) || options.init_scale <= 0) bad("init_scale", options.init_scale, "finite and > 0");
  if (!std::isfinite(options.growth_factor) || options.growth_factor <= 1)
    bad("growth_factor", options.growth_factor, "finite and > 1");
  if (!(options.backoff_factor > 0 && options.backoff_factor < 1))
    bad("backoff_factor", options.backoff_factor, "in (0, 1)");
  if (options.growth_interval < 1) bad("growth_interval", static_cast<double>(options.growth_interval), ">= 1");
}

at::Tensor LossScaler::scale_loss(const at::Tensor& loss) const { return loss * scale_; }

void LossScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    tracker_ = 0;
    return;
  }
  if (++tracker_ == options_.growth_interval) {
    // GradScaler does not grow past float32's range: the scale is a float32 there.
    const double grown = scale_ * options_.growth_factor;
    if (std::isfinite(static_cast<float>(grown))) scale_ = grown;
    tracker_ = 0;
  }
}

std::map<std::string, std::string> LossScaler::state() const {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", scale_);  // round-trips exactly
  return {{kScaleKey, buf}, {kTrackerKey, std::to_string(tracker_)}};
}

namespace {

// The value of `key` in `attributes` read by `parse` (which sets the count
// of characters used), or `fallback` when absent; a value not read whole or
// refused by `ok` is an error naming the key.
template <class T, class Parse, class Ok>
T attribute(const std::map<std::string, std::string>& attributes, const char* key, T fallback, Parse parse, Ok ok,
            const char* what) {
  const auto it = attributes.find(key);
  if (it == attributes.end()) return fallback;
  size_t used = 0;
  T value = fallback;
  try {
    value = parse(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != it->second.size() || !ok(value))
    throw Error(std::string("checkpoint attribute '") + key + "' is not " + what + ": '" + it->second + "'");
  return value;
}

}  // namespace

void LossScaler::load_state(const std::map<std::string, std::string>& attributes) {
  const double scale = attribute(
      attributes, kScaleKey, scale_, [](const std::string& s, size_t* used) { return std::stod(s, used); },
      [](double v) { return std::isfinite(v) && v > 0; }, "a positive finite loss scale");
  const int64_t tracker = attribute<int64_t>(
      attributes, kTrackerKey, tracker_, [](const std::string& s, size_t* used) { return std::stoll(s, used); },
      [](int64_t v) { return v >= 0; }, "a step count");
  scale_ = scale;
  tracker_ = tracker;
}

}  // namespace shardplan
