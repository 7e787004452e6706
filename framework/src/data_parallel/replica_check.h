#pragma once
// Internal: the replica check's core, shared by DataParallel::check_replicas
// and shardplan::check_replicas (training/replicas.cpp) for any sharded model.
#include <ATen/core/Tensor.h>

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace shardplan {

class Communicator;
struct ReportRow;

struct ReplicaAxis {
  std::string name;
  std::shared_ptr<Communicator> group;  // nullptr (or size 1): nothing to compare
  // Parameters not compared over this axis although not split over it
  // (the batch axis' data_parallel.ignore).
  std::set<std::string> skip;
};

// Compares, axis by axis, a checksum of each parameter's bytes across the
// ranks that should hold the same values: every rank of the axis when the
// parameter is not split over it, the ranks sharing a piece of a `shared`
// split. `rows[i]` describes params[i] (nullptr: replicated everywhere).
// Collective over every axis in `axes`; then every rank throws alike.
void check_replica_params(const std::vector<std::pair<std::string, at::Tensor>>& params,
                          const std::vector<const ReportRow*>& rows, const std::vector<ReplicaAxis>& axes);

}  // namespace shardplan
