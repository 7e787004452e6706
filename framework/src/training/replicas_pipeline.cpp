// shardplan/replicas.h for a Pipeline: its stage's parameters compared over
// every axis but the pipe axis, whose ranks hold other stages' parameters.
#include <map>
#include <set>
#include <utility>

#include "data_parallel/replica_check.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/pipeline.h"
#include "shardplan/replicas.h"
#include "shardplan/world.h"

namespace shardplan {

void check_replicas(Pipeline& pipe, const ParallelReport& report, World& world) {
  if (report.mesh.size() != world.size() || report.rank != world.rank())
    throw Error("check_replicas: the report is rank " + std::to_string(report.rank) + " of " + report.mesh.str() +
                ", not this rank's; pass the report parallelize() returned on this rank");
  std::map<std::string, const ReportRow*> by_path;
  for (const ReportRow& row : report.rows) by_path[row.path] = &row;
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::vector<const ReportRow*> rows;
  for (const auto& [name, p] : pipe.named_parameters()) {
    const auto it = by_path.find(name);
    if (it == by_path.end())
      throw Error("check_replicas: the report has no parameter '" + name + "' of the pipeline's stage");
    params.emplace_back(name, p);
    rows.push_back(it->second);
  }
  // The ranks of one group of any other axis run the same stage, so they
  // list the same parameters in the same order. Over the pipe axis nothing
  // is compared, but the word that a rank found a drift goes along it too,
  // so the other stages throw as well.
  std::vector<ReplicaAxis> axes;
  for (const auto& [name, n] : report.mesh.axes()) {
    ReplicaAxis axis{name, n > 1 ? world.group(report.mesh, name) : nullptr, {}};
    if (name == pipe.axis())
      for (const auto& named : params) axis.skip.insert(named.first);
    axes.push_back(std::move(axis));
  }
  check_replica_params(params, rows, axes);
}

}  // namespace shardplan
