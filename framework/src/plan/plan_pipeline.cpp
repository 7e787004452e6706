#include "plan_pipeline.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "plan_internal.h"
#include "base/utf8.h"

namespace shardplan {
namespace detail {
using plan_detail::loc_of;

namespace {

const std::vector<std::string> kSchedules = {"gpipe", "1f1b", "interleaved"};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string schedule_error(const std::string& name) {
  std::string best = kSchedules[0];
  for (const auto& s : kSchedules)
    if (edit_distance(name, s) < edit_distance(name, best)) best = s;
  const std::string shown = valid_utf8(name) ? name : "<not UTF-8>";
  return "pipeline.schedule '" + shown + "' is not a schedule (did you mean '" + best +
         "'?); schedules: gpipe, 1f1b, interleaved";
}

int positive(const YAML::Node& v, const SourceLoc& vloc, const std::string& what) {
  const auto n = v.IsScalar() ? plan_detail::parse_positive_int(v.Scalar()) : std::nullopt;
  if (!n) throw PlanError(vloc, "pipeline." + what + " must be a positive integer");
  return *n;
}

constexpr const char* kStagesExample =
    "pipeline.stages must be auto, {auto: time} or a list with one list of module path patterns per stage, e.g. "
    "stages: [['tok_emb|pos_emb', 'blocks\\.[01]'], ['blocks\\.[23]', 'ln_f|head']]";

void parse_stages(const YAML::Node& v, const SourceLoc& vloc, PipelineSpec& p) {
  p.stages_loc = vloc;
  if (v.IsScalar() && v.Scalar() == "auto") return;
  if (v.IsMap() && v.size() == 1 && v.begin()->first.IsScalar() && v.begin()->first.Scalar() == "auto") {
    const YAML::Node by = v.begin()->second;
    if (!by.IsScalar() || (by.Scalar() != "params" && by.Scalar() != "time"))
      throw PlanError(loc_of(by, vloc), "pipeline.stages: {auto: ...} balances by params or time");
    p.balance = by.Scalar();
    return;
  }
  if (!v.IsSequence() || v.size() == 0) throw PlanError(vloc, kStagesExample);
  std::set<std::string> seen;
  for (const YAML::Node& stage : v) {
    const SourceLoc sloc = loc_of(stage, vloc);
    if (!stage.IsSequence() || stage.size() == 0) throw PlanError(sloc, kStagesExample);
    std::vector<PipelineStagePattern> patterns;
    for (const YAML::Node& item : stage) {
      const SourceLoc iloc = loc_of(item, sloc);
      if (!item.IsScalar() || item.Scalar().empty()) throw PlanError(iloc, kStagesExample);
      if (!valid_utf8(item.Scalar())) throw PlanError(iloc, "pipeline stage pattern is not valid UTF-8");
      if (!seen.insert(item.Scalar()).second)
        throw PlanError(iloc, "pattern '" + item.Scalar() + "' is given twice in pipeline.stages");
      if (seen.size() > kMaxPlanRules)
        throw PlanError(iloc, "more than " + std::to_string(kMaxPlanRules) + " pipeline stage patterns");
      PipelineStagePattern sp;
      sp.pattern = item.Scalar();
      sp.loc = iloc;
      sp.matcher = plan_detail::compile(sp.pattern, iloc);
      patterns.push_back(std::move(sp));
    }
    p.stages.push_back(std::move(patterns));
  }
}

}  // namespace

void parse_pipeline(const YAML::Node& value, const SourceLoc& value_loc, Plan& plan) {
  PipelineSpec& p = plan.pipeline;
  p.loc = p.axis_loc = p.schedule_loc = p.stages_loc = value_loc;
  if (!value.IsMap())
    throw PlanError(value_loc, "pipeline must be a map, e.g. pipeline: {axis: pipe, schedule: 1f1b, micro_batches: 8}");
  std::set<std::string> seen;
  bool has_micro = false, has_virtual = false;
  for (auto it = value.begin(); it != value.end(); ++it) {
    const SourceLoc key_loc = loc_of(it->first, value_loc);
    const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
    const YAML::Node v = it->second;
    const SourceLoc vloc = loc_of(v, key_loc);
    if (!seen.insert(key).second) throw PlanError(key_loc, "duplicate key '" + key + "' in pipeline");
    if (key == "axis") {
      if (!v.IsScalar() || v.Scalar().empty()) throw PlanError(vloc, "pipeline.axis must be the name of a mesh axis");
      if (!valid_utf8(v.Scalar())) throw PlanError(vloc, "pipeline.axis is not valid UTF-8");
      p.axis = v.Scalar();
      p.axis_loc = vloc;
    } else if (key == "schedule") {
      if (!v.IsScalar() || std::find(kSchedules.begin(), kSchedules.end(), v.Scalar()) == kSchedules.end())
        throw PlanError(vloc, schedule_error(v.IsScalar() ? v.Scalar() : ""));
      p.schedule = v.Scalar();
      p.schedule_loc = vloc;
    } else if (key == "micro_batches") {
      p.micro_batches = positive(v, vloc, "micro_batches");
      p.micro_batches_loc = vloc;
      has_micro = true;
    } else if (key == "virtual_stages") {
      p.virtual_stages = positive(v, vloc, "virtual_stages");
      p.virtual_stages_loc = vloc;
      has_virtual = true;
    } else if (key == "stages") {
      parse_stages(v, vloc, p);
    } else {
      throw PlanError(key_loc, "unknown key '" + (valid_utf8(key) ? key : std::string("<not UTF-8>")) +
                                   "' in pipeline (expected axis, schedule, micro_batches, virtual_stages, stages)");
    }
  }
  // A default here would silently decide the memory a run needs and its bubble.
  if (!has_micro) throw PlanError(value_loc, "pipeline needs micro_batches: <how many per step>");
  if (has_virtual && p.schedule != "interleaved")
    throw PlanError(p.virtual_stages_loc, "pipeline.virtual_stages needs schedule: interleaved (the schedule is " +
                                              p.schedule + ")");
  if (p.schedule == "interleaved" && p.virtual_stages < 2)
    throw PlanError(has_virtual ? p.virtual_stages_loc : p.schedule_loc,
                    "schedule: interleaved needs virtual_stages: <2 or more model chunks per rank>");
  p.enabled = true;
}

void check_pipeline(const Plan& plan) {
  const PipelineSpec& p = plan.pipeline;
  if (!p.enabled) return;
  std::string names;
  const MeshAxisSpec* axis = nullptr;
  for (const auto& a : plan.mesh) {
    names += (names.empty() ? "" : ", ") + a.name;
    if (a.name == p.axis) axis = &a;
  }
  if (!axis) throw PlanError(p.axis_loc, "pipeline.axis '" + p.axis + "' is not a mesh axis; mesh axes are: " + names);
  if (plan.batch_axis() == p.axis)
    throw PlanError(p.axis_loc, "pipeline.axis '" + p.axis + "' is also the batch axis; a pipeline needs an axis of its own");
  for (const Rule& r : plan.rules)
    for (const auto& dim : r.layout)
      if (dim && *dim == p.axis)
        throw PlanError(r.layout_loc, "layout splits over '" + p.axis +
                                          "', the pipeline's axis; rules split over the other axes (the pipeline cuts "
                                          "between modules, not inside parameters)");
  // Under sequence parallelism a stage's boundary activation is its model
  // rank's part of the sequence, sent to the same model rank of the next
  // stage; the sequence cannot be split over the pipe axis itself.
  if (plan.sequence_parallel.enabled && plan.sequence_axis() == p.axis)
    throw PlanError(plan.sequence_parallel.axis_loc, "sequence_parallel.axis '" + p.axis +
                                                         "' is the pipeline's axis; the sequence splits over the "
                                                         "tensor-parallel axis inside each stage (e.g. model)");
  if (axis->size == MeshAxisSpec::kAutoSize) return;  // the rest is checked once the world size is known
  const int stages = axis->size * p.virtual_stages;
  if (!p.stages.empty() && static_cast<int>(p.stages.size()) != stages)
    throw PlanError(p.stages_loc, "pipeline.stages lists " + std::to_string(p.stages.size()) + " stages; the axis '" +
                                      p.axis + "' of size " + std::to_string(axis->size) +
                                      (p.virtual_stages > 1 ? " with " + std::to_string(p.virtual_stages) + " virtual stages" : "") +
                                      " needs " + std::to_string(stages));
  if (p.schedule == "1f1b" && p.micro_batches < axis->size)
    throw PlanError(p.micro_batches_loc, "schedule 1f1b needs at least as many micro_batches as stages (" +
                                             std::to_string(axis->size) + "), got " + std::to_string(p.micro_batches));
  if (p.schedule == "interleaved" && p.micro_batches % axis->size != 0)
    throw PlanError(p.micro_batches_loc, "schedule interleaved needs micro_batches divisible by the stages (" +
                                             std::to_string(axis->size) + "), got " + std::to_string(p.micro_batches));
}

std::string pipeline_yaml(const Plan& plan) {
  const PipelineSpec& p = plan.pipeline;
  if (!p.enabled) return "";
  std::ostringstream y;
  y << "pipeline: {axis: " << plan_detail::scalar(p.axis) << ", schedule: " << p.schedule
    << ", micro_batches: " << p.micro_batches;
  if (p.schedule == "interleaved") y << ", virtual_stages: " << p.virtual_stages;
  if (p.stages.empty()) {
    y << (p.balance == "time" ? ", stages: {auto: time}}\n" : ", stages: auto}\n");
    return y.str();
  }
  std::vector<std::string> stages;
  for (const auto& stage : p.stages) {
    std::vector<std::string> patterns;
    for (const auto& sp : stage) patterns.push_back(plan_detail::quoted(sp.pattern));
    stages.push_back("[" + plan_detail::join(patterns, ", ") + "]");
  }
  y << ", stages: [" << plan_detail::join(stages, ", ") << "]}\n";
  return y.str();
}

}  // namespace detail
}  // namespace shardplan
