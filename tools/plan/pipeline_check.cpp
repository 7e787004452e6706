#include "pipeline_check.h"

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "shardplan/error.h"
#include "shardplan/pipeline.h"

namespace shardplan_plan {

namespace {

using shardplan::ReportRow;

bool under(const std::string& path, const std::string& module) {
  return path.size() > module.size() && path.compare(0, module.size(), module) == 0 && path[module.size()] == '.';
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Per piece: parameter elements (unsharded, what `stages: auto` balances)
// and rank 0's bytes of them (its shards; a tied row holds none).
struct PieceSizes {
  std::vector<int64_t> elements, bytes;
};

PieceSizes piece_sizes(const std::vector<std::vector<std::string>>& pieces, const std::vector<ReportRow>& rows) {
  PieceSizes out{std::vector<int64_t>(pieces.size(), 0), std::vector<int64_t>(pieces.size(), 0)};
  for (const ReportRow& row : rows)
    for (size_t i = 0; i < pieces.size(); ++i)
      for (const std::string& m : pieces[i])
        if (under(row.path, m)) {
          out.elements[i] += product(row.global_shape);
          if (row.tied_to.empty()) out.bytes[i] += product(row.local_shape) * row.element_size;
        }
  return out;
}

std::string describe(const std::vector<std::vector<std::string>>& pieces, size_t first, size_t end) {
  std::string modules;
  for (size_t i = first; i < end; ++i)
    for (const std::string& m : pieces[i]) modules += (modules.empty() ? "" : ", ") + m;
  return "pieces " + std::to_string(first) + "-" + std::to_string(end - 1) + " (" + modules + ")";
}

}  // namespace

void check_pipeline(torch::nn::Module& model, const shardplan::Plan& plan, shardplan::PlanCheck& result) {
  const shardplan::PipelineSpec& spec = plan.pipeline;
  if (!spec.enabled || !result.ok()) return;
  auto* pieces = dynamic_cast<shardplan::PipelineModel*>(&model);
  if (!pieces) {
    result.errors.push_back(shardplan::PlanError(spec.loc, "pipeline: the model does not declare its pieces "
                                                           "(shardplan::PipelineModel), so it cannot be cut into stages")
                                .what());
    return;
  }
  const int p = result.report.mesh.axis_size(spec.axis), v = spec.virtual_stages;
  const auto list = pieces->pieces();
  const PieceSizes sizes = piece_sizes(list, result.report.rows);
  shardplan::StageRanges stages;
  try {
    stages = shardplan::assign_stages(list, sizes.elements, spec, p * v);
    (void)shardplan::pipeline_schedule(spec.schedule, p, spec.micro_batches, v);  // refuses what cannot be scheduled
  } catch (const std::exception& e) {
    result.errors.push_back(e.what());
    return;
  }
  char bubble[32];
  std::snprintf(bubble, sizeof bubble, "%.3f", shardplan::pipeline_bubble(spec.schedule, p, spec.micro_batches, v));
  result.notes.push_back("pipeline over '" + spec.axis + "': " + std::to_string(p) + " stages, schedule " +
                         spec.schedule + ", " + std::to_string(spec.micro_batches) +
                         " micro-batches, predicted bubble " + bubble);
  // Timing needs the run's batch and ranks; what is shown is the guess by parameters.
  if (spec.stages.empty() && spec.balance == "time")
    result.notes.push_back("pipeline stages {auto: time}: when the run starts, every rank times each piece's forward on "
                           "its first micro-batch and the slowest rank's times are balanced, so every rank cuts alike; "
                           "the stages below are the cut by parameter count, which the timed one replaces");
  for (size_t k = 0; k < stages.size(); ++k) {
    int64_t bytes = 0;
    for (size_t i = stages[k].first; i < stages[k].second; ++i) bytes += sizes.bytes[i];
    result.notes.push_back("pipeline stage " + std::to_string(k) +
                           (v > 1 ? " (rank " + std::to_string(k % p) + "'s chunk " + std::to_string(k / p) + ")" : "") +
                           ": " + describe(list, stages[k].first, stages[k].second) + ", " + std::to_string(bytes) +
                           " parameter bytes on its first rank");
  }
  result.notes.push_back("pipeline: the parameter bytes per rank above count the whole model; each rank keeps only "
                         "its stage's (and steps only those), and a measured step runs the model whole, without the "
                         "activations sent between stages");
}

}  // namespace shardplan_plan
