#pragma once
// What every auto_plan shares, whoever found the units (the probe of a
// torch::nn model in auto_plan.cpp, or a caller of auto_plan_for_units): the
// mesh the plan runs on, and writing rules as a plan (auto_plan_write.cpp).
#include <string>
#include <vector>

#include "shardplan/auto_plan.h"
#include "shardplan/plan.h"

namespace shardplan {
namespace auto_detail {

// AutoPlanOptions::mesh checked against the world size.
struct MeshChoice {
  std::string spec;        // as the plan writes it: "{data: 2, model: auto}"
  std::string axis;        // the model axis the rules shard over
  int axis_size = 1;       // its resolved size: what divisibility is decided at
  std::string batch_axis;  // the other axis, "" on a 1-D mesh
  int world_size = 1;
  // "2 ranks over 'model'" or "4 ranks, mesh {...}: rules over 'model' (2
  // ranks), the batch split over 'data'"; and "at 2 ranks" / "at 2 'model'
  // ranks (of 4)" for a unit a check rejected.
  std::string describe() const;
  std::string at_ranks() const;
};

// Throws shardplan::Error, one line, for a world size below 1, an empty axis,
// a mesh that is not a one-line YAML flow map, does not fit the world size,
// lacks the axis, or has more than one other axis.
MeshChoice choose_mesh(const AutoPlanOptions& options, int world_size);

// `specs` as a plan on `mesh`: paths that differ only in numeric components
// share one \d+ rule when that pattern matches exactly them among `universe`
// (every parameter and planned module path); each rule's comment is its why.
Plan write_plan(const std::vector<const AutoPlanRule*>& specs, std::vector<std::string> universe,
                const MeshChoice& mesh);

// Whether `text` (a check's error) names `path` as a whole word.
bool mentions(const std::string& text, const std::string& path);

}  // namespace auto_detail
}  // namespace shardplan
