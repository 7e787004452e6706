// shardplan/clip_grad.h for torch::nn models, DataParallel (plain and
// ZeRO-1), shardplan::Optimizer and TensorParallel: each lists the gradient
// pieces this rank holds and which it counts; grad_norm.cpp does the rest.
// (TorchScript modules: clip_grad_script.cpp.)
#include "shardplan/clip_grad.h"

#include <torch/torch.h>

#include <map>
#include <set>

#include "base/shape_text.h"
#include "clip_grad_internal.h"
#include "data_parallel/data_parallel_impl.h"
#include "grad_norm_internal.h"
#include "shardplan/error.h"
#include "shardplan/optimizer.h"
#include "shardplan/parallelize.h"
#include "shardplan/tensor_parallel.h"
#include "shardplan/world.h"

namespace shardplan {
namespace {

// A DataParallel over a pipeline stage's parameters (pipe_axis set): every
// stage counts its own, as if the pipe axis split them.
//
// ZeRO-1: the reduced slices of the buckets, cut at the parameters' edges so
// that each part takes its parameter's ownership on the model axes (the
// batch axis' slices are disjoint: every rank counts its own). The padding
// at a bucket's end belongs to no parameter and is left out.
std::vector<GradPiece> zero_pieces(const DataParallel::Impl& d) {
  std::map<std::string, const ReportRow*> rows;
  for (size_t i = 0; i < d.unique.size(); ++i) rows[d.unique[i].first] = &d.unique_rows[i];
  std::vector<GradPiece> pieces;
  for (const auto& b : d.buckets) {
    const int64_t n = b.info.padded / d.size, lo = d.rank * n;
    for (size_t k : b.entries) {
      const auto& e = d.entries[k];
      const int64_t begin = std::max(e.offset, lo), end = std::min(e.offset + e.numel, lo + n);
      if (begin >= end) continue;
      const ReportRow& row = *rows.at(e.path);
      pieces.push_back({b.shard.narrow(0, begin - lo, end - begin),
                        counts_on_this_rank(row, d.mesh, d.world_rank, d.axis, d.pipe_axis)});
    }
  }
  // Outside the buckets: their own gradients (ZeroOptimizer::locals()).
  const std::set<std::string> ignored(d.ignored.begin(), d.ignored.end()), split(d.split.begin(), d.split.end());
  for (size_t i = 0; i < d.unique.size(); ++i) {
    const bool own = ignored.count(d.unique[i].first) > 0;
    const at::Tensor& g = d.unique[i].second.grad();
    if ((own || split.count(d.unique[i].first)) && g.defined())
      pieces.push_back({g, counts_on_this_rank(d.unique_rows[i], d.mesh, d.world_rank, own ? d.axis : "", d.pipe_axis)});
  }
  return pieces;
}

const DataParallel::Impl& checked_impl(DataParallel& dp) {
  const DataParallel::Impl& d = dp.impl();
  if (d.mesh.size() != d.world->size())
    throw Error("grad_norm: the DataParallel's mesh " + d.mesh.str() + " has " + std::to_string(d.mesh.size()) +
                " ranks but the world has " + std::to_string(d.world->size()));
  return d;
}

std::vector<GradPiece> data_parallel_pieces(DataParallel& dp) {
  dp.finish();  // nothing to do when backward's end averaged already
  const DataParallel::Impl& d = checked_impl(dp);
  if (d.zero) return zero_pieces(d);
  // Mixed precision's float32 gradients live in the buckets (the masters'
  // .grad is a view of them), the model's .grad is dropped.
  std::map<const void*, size_t> entry_of;
  if (d.main())
    for (size_t k = 0; k < d.entries.size(); ++k) entry_of[d.entries[k].param.unsafeGetTensorImpl()] = k;
  const std::set<std::string> ignored(d.ignored.begin(), d.ignored.end());
  std::vector<GradPiece> pieces;
  for (size_t i = 0; i < d.unique.size(); ++i) {
    const auto e = entry_of.find(d.unique[i].second.unsafeGetTensorImpl());
    at::Tensor g = d.unique[i].second.grad();
    if (e != entry_of.end()) g = e->second < d.zero_used.size() && d.zero_used[e->second] ? d.main_grad(e->second)
                                                                                         : at::Tensor();
    if (!g.defined()) continue;
    // An ignored parameter is not averaged: each rank's gradient is its own.
    const bool own = ignored.count(d.unique[i].first) > 0;
    pieces.push_back({g, counts_on_this_rank(d.unique_rows[i], d.mesh, d.world_rank, own ? d.axis : "", d.pipe_axis)});
  }
  return pieces;
}

// What a shardplan::Optimizer steps with, as its step_tensors() lists them:
// with masters their float32 gradients, with ZeRO-1 its slices' segments
// (the batch axis' slices are disjoint: every rank counts its own); with a
// loss scaler unscaled first, as GradScaler.unscale_ before clipping.
std::vector<GradPiece> optimizer_pieces(Optimizer& opt) {
  opt.unscale_();
  if (!opt.zero() && !opt.masters()) return data_parallel_pieces(opt.data_parallel());
  const std::vector<at::Tensor> grads = opt.step_grads();
  const DataParallel::Impl& d = checked_impl(opt.data_parallel());
  std::vector<GradPiece> pieces;
  if (opt.zero()) {
    std::map<const void*, const ReportRow*> rows;
    for (size_t i = 0; i < d.unique.size(); ++i) rows[d.unique[i].second.unsafeGetTensorImpl()] = &d.unique_rows[i];
    size_t k = 0;
    for (const auto& b : opt.zero()->layout())
      for (const auto& s : b.segments) {
        const at::Tensor& g = grads[k++];
        if (!g.defined()) continue;
        const ReportRow& row = *rows.at(b.members[s.member].first.unsafeGetTensorImpl());
        pieces.push_back({g, counts_on_this_rank(row, d.mesh, d.world_rank, d.axis, d.pipe_axis)});
      }
    // Then the locals, in the model's order: an ignored one is this rank's own.
    const std::set<std::string> ignored(d.ignored.begin(), d.ignored.end());
    std::set<const void*> locals;
    for (const auto& p : opt.zero()->locals()) locals.insert(p.unsafeGetTensorImpl());
    for (size_t i = 0; i < d.unique.size(); ++i) {
      if (!locals.count(d.unique[i].second.unsafeGetTensorImpl())) continue;
      const at::Tensor& g = grads[k++];
      const bool own = ignored.count(d.unique[i].first) > 0;
      if (g.defined())
        pieces.push_back({g, counts_on_this_rank(d.unique_rows[i], d.mesh, d.world_rank, own ? d.axis : "", d.pipe_axis)});
    }
    return pieces;
  }
  const std::set<std::string> ignored(d.ignored.begin(), d.ignored.end());
  for (size_t i = 0; i < d.unique.size(); ++i) {  // the masters, in the same order
    if (!grads[i].defined()) continue;
    const bool own = ignored.count(d.unique[i].first) > 0;
    pieces.push_back({grads[i], counts_on_this_rank(d.unique_rows[i], d.mesh, d.world_rank, own ? d.axis : "", d.pipe_axis)});
  }
  return pieces;
}

std::vector<GradPiece> tensor_parallel_pieces(TensorParallelImpl& tp) {
  std::vector<GradPiece> pieces;
  for (const auto& p : tp.parameters())
    if (p.grad().defined()) pieces.push_back({p.grad(), true});
  return pieces;
}

}  // namespace

void check_report_describes(const std::vector<std::pair<std::string, at::Tensor>>& params,
                            const ParallelReport& report, World& world, const char* who) {
  if (report.mesh.size() != world.size() || report.rank != world.rank())
    throw Error(std::string(who) + ": the report is rank " + std::to_string(report.rank) + " of a mesh " +
                report.mesh.str() + " of " + std::to_string(report.mesh.size()) + " ranks, but this is rank " +
                std::to_string(world.rank()) + " of " + std::to_string(world.size()) +
                "; pass the report parallelize() returned on this rank");
  // A report of another model would count the wrong elements: refused
  // before anything is exchanged, naming the first difference.
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    if (i >= report.rows.size() || report.rows[i].path != name || report.rows[i].local_shape != p.sizes().vec())
      throw Error(std::string(who) + ": the report does not describe this model: its parameter " +
                  std::to_string(i) + " is '" + name + "' " + shape_str(p.sizes()) + ", the report's row " +
                  (i < report.rows.size() ? "is '" + report.rows[i].path + "' " + shape_str(report.rows[i].local_shape)
                                          : std::string("is missing")) +
                  "; pass the report parallelize() returned for this model");
  }
  for (size_t i = params.size(); i < report.rows.size(); ++i)
    if (!report.rows[i].global_shape.empty() || !report.rows[i].local_shape.empty())
      throw Error(std::string(who) + ": the report does not describe this model: it has parameter '" +
                  report.rows[i].path + "', which the model lacks; pass the report parallelize() returned for it");
}

std::vector<GradPiece> named_pieces(const std::vector<std::pair<std::string, at::Tensor>>& params,
                                    const ParallelReport& report, World& world, const char* who) {
  check_report_describes(params, report, world, who);
  std::set<const void*> seen;
  std::vector<GradPiece> pieces;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i].second;
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;  // a tied tensor: scaled once
    if (!p.grad().defined()) continue;
    pieces.push_back({p.grad(), counts_on_this_rank(report.rows[i], report.mesh, world.rank())});
  }
  return pieces;
}

double named_grad_norm(const std::vector<std::pair<std::string, at::Tensor>>& params, const ParallelReport& report,
                       World& world, double norm_type, bool error_if_nonfinite) {
  check_norm_type(norm_type, "grad_norm");
  return pieces_norm(named_pieces(params, report, world, "grad_norm"), world, norm_type, error_if_nonfinite);
}

double named_clip_grad_norm(const std::vector<std::pair<std::string, at::Tensor>>& params,
                            const ParallelReport& report, World& world, double max_norm, double norm_type,
                            bool error_if_nonfinite) {
  check_clip_args(max_norm, norm_type, "clip_grad_norm_");
  return clip_pieces(named_pieces(params, report, world, "clip_grad_norm_"), world.size() > 1 ? &world.comm() : nullptr,
              max_norm, norm_type, error_if_nonfinite);
}

namespace {

std::vector<std::pair<std::string, at::Tensor>> named_of(torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

}  // namespace

double grad_norm(torch::nn::Module& model, const ParallelReport& report, World& world, double norm_type,
                 bool error_if_nonfinite) {
  return named_grad_norm(named_of(model), report, world, norm_type, error_if_nonfinite);
}

double clip_grad_norm_(torch::nn::Module& model, const ParallelReport& report, World& world, double max_norm,
                       double norm_type, bool error_if_nonfinite) {
  return named_clip_grad_norm(named_of(model), report, world, max_norm, norm_type, error_if_nonfinite);
}

double grad_norm(DataParallel& dp, double norm_type, bool error_if_nonfinite) {
  check_norm_type(norm_type, "grad_norm");
  const auto pieces = data_parallel_pieces(dp);
  return pieces_norm(pieces, dp.impl().world.get(), norm_type, error_if_nonfinite);
}

double clip_grad_norm_(DataParallel& dp, double max_norm, double norm_type, bool error_if_nonfinite) {
  check_clip_args(max_norm, norm_type, "clip_grad_norm_");
  const auto pieces = data_parallel_pieces(dp);
  return clip_pieces(pieces, dp.impl().world.get(), max_norm, norm_type, error_if_nonfinite);
}

double grad_norm(Optimizer& opt, double norm_type, bool error_if_nonfinite) {
  check_norm_type(norm_type, "grad_norm");
  const auto pieces = optimizer_pieces(opt);
  return pieces_norm(pieces, opt.data_parallel().impl().world.get(), norm_type, error_if_nonfinite);
}

double clip_grad_norm_(Optimizer& opt, double max_norm, double norm_type, bool error_if_nonfinite) {
  check_clip_args(max_norm, norm_type, "clip_grad_norm_");
  const auto pieces = optimizer_pieces(opt);
  return clip_pieces(pieces, opt.data_parallel().impl().world.get(), max_norm, norm_type, error_if_nonfinite);
}

double grad_norm(TensorParallelImpl& tp, double norm_type, bool error_if_nonfinite) {
  return pieces_norm(tensor_parallel_pieces(tp), nullptr, norm_type, error_if_nonfinite);
}

double clip_grad_norm_(TensorParallelImpl& tp, double max_norm, double norm_type, bool error_if_nonfinite) {
  check_clip_args(max_norm, norm_type, "clip_grad_norm_");
  return clip_pieces(tensor_parallel_pieces(tp), nullptr, max_norm, norm_type, error_if_nonfinite);
}

}  // namespace shardplan
