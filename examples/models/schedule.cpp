#include "models/schedule.h"

#include <torch/optim/optimizer.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "models/options.h"
#include "models/train_args.h"
#include "shardplan/error.h"

namespace shardplan {
namespace examples {
namespace {

constexpr double kPi = 3.14159265358979323846;

// The shortest text that reads back as the same double: the attribute is
// compared exactly on resume, and a message shows 0.1, not 0.10000000000000001.
std::string exact(double v) {
  char buf[32];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// The "schedule" attribute back into settings; a hand-edited one that does
// not read is an error naming it.
ScheduleSettings parse_settings(const std::string& text, const std::string& from) {
  ScheduleSettings s;
  std::istringstream in(text);
  std::string key, value;
  bool lr = false;
  try {
    while (in >> key) {
      if (!(in >> value)) throw std::invalid_argument(key);
      if (key == "--warmup")
        s.warmup = count_option_int(key, value, 0);
      else if (key == "--lr")
        s.lr = option_double(value), lr = true;
      else if (key == "--lr-min")
        s.lr_min = option_double(value);
      else if (key == "--steps")
        s.decay_end = count_option_int(key, value, 1);
      else
        throw std::invalid_argument(key);
    }
  } catch (const std::exception&) {
    lr = false;
  }
  if (!lr || std::isnan(s.lr_min) != (s.decay_end == 0))
    throw Error("checkpoint '" + from + "': its attribute schedule '" + text + "' does not read as a schedule");
  return s;
}

}  // namespace

bool ScheduleSettings::operator==(const ScheduleSettings& o) const {
  if (constant() && o.constant()) return true;  // --lr may change, as it always could
  const bool decay = !std::isnan(lr_min);
  return lr == o.lr && warmup == o.warmup && decay == !std::isnan(o.lr_min) && (!decay || lr_min == o.lr_min) &&
         decay_end == o.decay_end;
}

std::string ScheduleSettings::str() const {
  if (constant()) return "a constant lr (no --warmup, no --lr-min)";
  std::string s = "--warmup " + std::to_string(warmup) + " --lr " + exact(lr);
  if (!std::isnan(lr_min)) s += " --lr-min " + exact(lr_min) + " --steps " + std::to_string(decay_end);
  return s;
}

ScheduleSettings schedule_settings(const Args& a) {
  ScheduleSettings s;
  s.lr = a.lr;
  s.warmup = a.warmup;
  s.lr_min = a.lr_min;
  s.decay_end = std::isnan(a.lr_min) ? 0 : a.steps;
  return s;
}

std::string check_schedule_options(const Args& a) {
  if (a.warmup > 0 && a.warmup >= a.steps)
    return "--warmup " + std::to_string(a.warmup) + " leaves no step after it: it must be less than --steps " +
           std::to_string(a.steps);
  if (!std::isnan(a.lr_min) && (a.lr_min < 0 || a.lr_min > a.lr))
    return "--lr-min " + exact(a.lr_min) + " must be from 0 to --lr " + exact(a.lr);
  // A decay over no step never reaches --lr-min: --steps 0 only loads.
  if (!std::isnan(a.lr_min) && a.steps < 1) return "--lr-min decays over --steps: it needs --steps of at least 1";
  if (a.override_schedule && a.load.empty() && !a.resume_auto)
    return "--override-schedule takes effect with --load DIR or --resume auto only";
  return "";
}

double Schedule::lr_at(int64_t k) const {
  if (s_.warmup > 0 && k <= s_.warmup) return s_.lr * static_cast<double>(k) / s_.warmup;
  if (std::isnan(s_.lr_min)) return s_.lr;
  if (k >= s_.decay_end) return s_.lr_min;  // past --steps only after an override shortened it
  const double ratio = static_cast<double>(k - s_.warmup) / (s_.decay_end - s_.warmup);
  return s_.lr_min + 0.5 * (std::cos(kPi * ratio) + 1.0) * (s_.lr - s_.lr_min);
}

double Schedule::apply(torch::optim::Optimizer& opt) const {
  const double lr = next_lr();
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
  return lr;
}

void Schedule::save(std::map<std::string, std::string>& attributes) const {
  if (s_.constant()) return;
  attributes["schedule"] = s_.str();
  attributes["schedule_position"] = std::to_string(position_);
}

void Schedule::resume(const std::map<std::string, std::string>& attributes, bool override_settings,
                      const std::string& from) {
  const auto settings = attributes.find("schedule");
  const auto position = attributes.find("schedule_position");
  const auto step = attributes.find("step");
  // A checkpoint without a schedule trained at a constant lr, one
  // optimizer step per step.
  const ScheduleSettings saved =
      settings == attributes.end() ? ScheduleSettings{} : parse_settings(settings->second, from);
  const auto& at = settings == attributes.end() ? step : position;
  int64_t p = 0;
  if (at != attributes.end()) {
    try {
      p = count_option(at->first, at->second, 0, INT32_MAX);
    } catch (const CountError&) {
      throw Error("checkpoint '" + from + "': its attribute " + at->first + " '" + at->second +
                  "' is not a step count");
    }
  } else if (settings != attributes.end()) {
    throw Error("checkpoint '" + from + "' records a schedule but no schedule_position");
  }
  if (!(saved == s_) && !override_settings)
    throw Error("checkpoint '" + from + "' was trained with " + saved.str() + ", this run asks for " + s_.str() +
                ": give the checkpoint's settings to continue its lr sequence, or --override-schedule to go on with "
                "these from its position " +
                std::to_string(p));
  position_ = p;
}

}  // namespace examples
}  // namespace shardplan
