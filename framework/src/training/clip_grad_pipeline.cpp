// shardplan/clip_grad.h for a Pipeline: its stage's parameters as the
// pieces, the pipe axis left out of the ownership rule (the stages hold
// different parameters, so every rank counts its own).
#include <map>

#include "grad_norm_internal.h"
#include "shardplan/clip_grad.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/pipeline.h"
#include "shardplan/world.h"

namespace shardplan {
namespace {

std::vector<GradPiece> pipeline_pieces(Pipeline& pipe, const ParallelReport& report, World& world, const char* who) {
  if (report.mesh.size() != world.size() || report.rank != world.rank())
    throw Error(std::string(who) + ": the report is rank " + std::to_string(report.rank) + " of " +
                report.mesh.str() + ", not this rank's; pass the report parallelize() returned on this rank");
  if (pipe.data_parallel() && pipe.data_parallel()->zero())
    throw Error(std::string(who) + ": a pipeline under data_parallel.zero is not supported yet");
  std::map<std::string, const ReportRow*> rows;
  for (const ReportRow& row : report.rows) rows[row.path] = &row;
  std::vector<GradPiece> pieces;
  for (const auto& [name, p] : pipe.named_parameters()) {
    const auto it = rows.find(name);
    if (it == rows.end())
      throw Error(std::string(who) + ": the report has no parameter '" + name + "' of the pipeline's stage");
    // A tie across stages: the copy under a later path sums the same
    // gradient (Pipeline::step) and is not counted again.
    if (p.grad().defined())
      pieces.push_back({p.grad(), counts_on_this_rank(*it->second, report.mesh, world.rank(), pipe.axis())});
  }
  return pieces;
}

}  // namespace

double grad_norm(Pipeline& pipe, const ParallelReport& report, World& world, double norm_type,
                 bool error_if_nonfinite) {
  check_norm_type(norm_type, "grad_norm");
  return pieces_norm(pipeline_pieces(pipe, report, world, "grad_norm"), world, norm_type, error_if_nonfinite);
}

double clip_grad_norm_(Pipeline& pipe, const ParallelReport& report, World& world, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  check_clip_args(max_norm, norm_type, "clip_grad_norm_");
  return clip_pieces(pipeline_pieces(pipe, report, world, "clip_grad_norm_"),
                     world.size() > 1 ? &world.comm() : nullptr, max_norm, norm_type, error_if_nonfinite);
}

}  // namespace shardplan
