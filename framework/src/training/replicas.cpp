// shardplan/replicas.h: the replica check of data_parallel/replica_check.h
// for any sharded model, its axis groups the ones parallelize made.
#include "shardplan/replicas.h"

#include <torch/torch.h>

#include <set>

#include "clip_grad_internal.h"
#include "data_parallel/replica_check.h"
#include "parallel/tensor_parallel_internal.h"
#include "replicas_internal.h"
#include "shardplan/parallelize.h"
#include "shardplan/tensor_parallel.h"
#include "shardplan/world.h"

namespace shardplan {

void check_named_replicas(const std::vector<std::pair<std::string, at::Tensor>>& params,
                          const ParallelReport& report, World& world) {
  check_report_describes(params, report, world, "check_replicas");
  std::vector<std::pair<std::string, at::Tensor>> unique;
  std::vector<const ReportRow*> rows;
  std::set<const void*> seen;
  for (size_t i = 0; i < params.size(); ++i)
    if (seen.insert(params[i].second.unsafeGetTensorImpl()).second) {
      unique.push_back(params[i]);
      rows.push_back(&report.rows[i]);
    }
  std::vector<ReplicaAxis> axes;
  for (const auto& [name, n] : report.mesh.axes())
    axes.push_back(ReplicaAxis{name, n > 1 ? world.group(report.mesh, name) : nullptr, {}});
  check_replica_params(unique, rows, axes);
}

void check_replicas(torch::nn::Module& model, const ParallelReport& report, World& world) {
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& item : model.named_parameters()) params.emplace_back(item.key(), item.value());
  check_named_replicas(params, report, world);
}

// The wrapper's non-holders copy their holder before every forward, so only
// what the holders themselves hold can differ: each rank's replica is
// brought up to date as a forward would, then checked as a sharded model
// on its own thread and world.
void check_replicas(TensorParallelImpl& tp) {
  auto& rt = *tp.rt_;
  rt.run([&](int r) {
    rt.sync_replicated(r);
    check_replicas(*rt.replicas[r], rt.reports[r], *rt.worlds[r]);
  });
}

}  // namespace shardplan
