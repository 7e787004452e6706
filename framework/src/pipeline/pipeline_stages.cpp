// assign_stages: which pieces of a model each pipeline stage runs.
#include <algorithm>
#include <limits>

#include "shardplan/error.h"
#include "shardplan/pipeline.h"

namespace shardplan {

namespace {

struct StageMatch {
  int stage = -1;
  const PipelineStagePattern* pattern = nullptr;
};

// The one stage whose patterns match `module`; PlanError when none or several do.
StageMatch stage_of(const std::string& module, const PipelineSpec& spec, std::vector<std::vector<bool>>& used) {
  StageMatch found;
  for (size_t s = 0; s < spec.stages.size(); ++s)
    for (size_t i = 0; i < spec.stages[s].size(); ++i) {
      const PipelineStagePattern& p = spec.stages[s][i];
      if (!p.matches(module)) continue;
      used[s][i] = true;
      if (found.stage >= 0 && found.stage != static_cast<int>(s))
        throw PlanError(p.loc, "module '" + module + "' is matched by stage " + std::to_string(found.stage) + "'s '" +
                                   found.pattern->pattern + "' and by stage " + std::to_string(s) + "'s '" + p.pattern +
                                   "'; each module belongs to one stage");
      if (found.stage < 0) found = {static_cast<int>(s), &p};
    }
  if (found.stage < 0) throw PlanError(spec.stages_loc, "module '" + module + "' is in no stage of pipeline.stages");
  return found;
}

StageRanges explicit_stages(const std::vector<std::vector<std::string>>& pieces, const PipelineSpec& spec) {
  std::vector<std::vector<bool>> used;
  for (const auto& stage : spec.stages) used.emplace_back(stage.size(), false);
  StageRanges ranges(spec.stages.size(), {0, 0});
  std::vector<bool> seen(spec.stages.size(), false);
  int previous = 0;
  std::string previous_module;
  for (size_t i = 0; i < pieces.size(); ++i) {
    StageMatch piece;
    for (const std::string& module : pieces[i]) {
      const StageMatch m = stage_of(module, spec, used);
      if (piece.stage >= 0 && m.stage != piece.stage)
        throw PlanError(m.pattern->loc, "module '" + module + "' is in stage " + std::to_string(m.stage) + " but '" +
                                            pieces[i][0] + "' in stage " + std::to_string(piece.stage) +
                                            ": they are one piece of the model, which cannot be cut between them");
      if (piece.stage < 0) piece = m;
    }
    if (piece.stage < previous)
      throw PlanError(piece.pattern->loc, "module '" + pieces[i][0] + "' is in stage " + std::to_string(piece.stage) +
                                              ", after '" + previous_module + "' in stage " + std::to_string(previous) +
                                              ": stages must follow the model's order");
    auto& r = ranges[piece.stage];
    if (!seen[piece.stage]) r.first = i;
    seen[piece.stage] = true;
    r.second = i + 1;
    previous = piece.stage;
    previous_module = pieces[i].empty() ? "" : pieces[i][0];
  }
  for (size_t s = 0; s < spec.stages.size(); ++s)
    for (size_t i = 0; i < spec.stages[s].size(); ++i)
      if (!used[s][i])
        throw PlanError(spec.stages[s][i].loc, "pattern '" + spec.stages[s][i].pattern + "' of stage " +
                                                   std::to_string(s) + " matches no module of the model's pieces");
  return ranges;
}

// The linear partition: best[k][i], the smallest largest stage over the
// first i pieces in k stages, each stage at least one piece.
StageRanges balanced_stages(const std::vector<int64_t>& params, int stages) {
  const size_t n = params.size(), k = static_cast<size_t>(stages);
  std::vector<int64_t> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + params[i];
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(k + 1, std::vector<int64_t>(n + 1, kNone));
  std::vector<std::vector<size_t>> cut(k + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = 0;
  for (size_t s = 1; s <= k; ++s)
    for (size_t i = s; i <= n; ++i)
      for (size_t j = s - 1; j < i; ++j) {
        if (best[s - 1][j] == kNone) continue;
        const int64_t worst = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        if (worst < best[s][i]) best[s][i] = worst, cut[s][i] = j;
      }
  StageRanges ranges(k);
  for (size_t s = k, end = n; s > 0; --s) {
    ranges[s - 1] = {cut[s][end], end};
    end = cut[s][end];
  }
  return ranges;
}

}  // namespace

StageRanges assign_stages(const std::vector<std::vector<std::string>>& pieces, const std::vector<int64_t>& piece_params,
                          const PipelineSpec& spec, int stages) {
  if (piece_params.size() != pieces.size())
    throw Error("assign_stages: " + std::to_string(piece_params.size()) + " parameter counts for " +
                std::to_string(pieces.size()) + " pieces");
  if (stages < 1) throw Error("assign_stages: " + std::to_string(stages) + " stages");
  if (static_cast<int>(pieces.size()) < stages)
    throw PlanError(spec.loc, "the model has " + std::to_string(pieces.size()) + " pieces, fewer than the " +
                                  std::to_string(stages) + " pipeline stages");
  for (size_t i = 0; i < pieces.size(); ++i)
    if (pieces[i].empty()) throw Error("pipeline: piece " + std::to_string(i) + " of the model names no module");
  if (spec.stages.empty()) return balanced_stages(piece_params, stages);
  if (static_cast<int>(spec.stages.size()) != stages)
    throw PlanError(spec.stages_loc, "pipeline.stages lists " + std::to_string(spec.stages.size()) +
                                         " stages for a pipeline of " + std::to_string(stages));
  return explicit_stages(pieces, spec);
}

}  // namespace shardplan
