// The core of shardplan/clip_grad.h (grad_norm_internal.h): the ownership
// rule, the local sums, the one all-reduce and torch's coefficient.
#include <ATen/ATen.h>

#include <cmath>
#include <sstream>

#include "grad_norm_internal.h"
#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/mesh.h"
#include "shardplan/parallelize.h"
#include "shardplan/world.h"

namespace shardplan {
namespace {

std::string norm_text(double x) {
  std::ostringstream s;
  s.precision(17);
  s << x;
  return s.str();
}

}  // namespace

void check_norm_type(double norm_type, const char* who) {
  if (std::isnan(norm_type) || norm_type <= 0)
    throw Error(std::string(who) + ": norm_type " + norm_text(norm_type) +
                " is not a norm; use 2, any p > 0, or INFINITY (the max norm)");
}

void check_clip_args(double max_norm, double norm_type, const char* who) {
  if (std::isnan(max_norm) || max_norm < 0)
    throw Error(std::string(who) + ": max_norm " + norm_text(max_norm) +
                " is not a norm to clip to; give a number >= 0");
  check_norm_type(norm_type, who);
}

bool counts_on_this_rank(const ReportRow& row, const Mesh& mesh, int world_rank, const std::string& skip_axis,
                         const std::string& skip_axis2) {
  if (!row.tied_to.empty()) return false;  // counted under its first path
  for (const auto& [axis, n] : mesh.axes()) {
    if (n <= 1 || axis == skip_axis || axis == skip_axis2) continue;
    const int c = mesh.coord(world_rank, axis);
    const ShardSplit* split = nullptr;
    for (const auto& s : row.splits)
      if (s.axis == axis) split = &s;
    if (split ? (split->shared > 1 && c % split->shared != 0) : c != 0) return false;
  }
  return true;
}

bool counts_on_this_rank(const ReportRow& row, const Mesh& mesh, int world_rank, const std::string& skip_axis) {
  return counts_on_this_rank(row, mesh, world_rank, skip_axis, "");
}

bool counts_on_this_rank(const ReportRow& row, const Mesh& mesh, int world_rank) {
  return counts_on_this_rank(row, mesh, world_rank, "", "");
}

double pieces_norm(const std::vector<GradPiece>& pieces, World& world, double norm_type, bool error_if_nonfinite) {
  return pieces_norm(pieces, world.size() > 1 ? &world.comm() : nullptr, norm_type, error_if_nonfinite);
}

double pieces_norm(const std::vector<GradPiece>& pieces, Communicator* comm, double norm_type,
                   bool error_if_nonfinite) {
  check_norm_type(norm_type, "grad_norm");
  const bool max = std::isinf(norm_type);
  at::Device device = at::kCPU;
  for (const auto& p : pieces)
    if (p.grad.defined()) {
      device = p.grad.device();
      break;
    }
  // [sum |g|^p (inf: max |g|), NaN seen]: a NaN travels as a flag, since a
  // backend's max need not propagate it.
  std::vector<at::Tensor> parts;
  for (const auto& p : pieces) {
    if (!p.counts || !p.grad.defined() || p.grad.numel() == 0) continue;
    const at::Tensor g = p.grad.detach();
    // Per tensor torch's own norm (its clip_grad_norm_'s), in float32 at
    // least (half gradients would overflow); across tensors and ranks in
    // float64. A float64 copy of float32 gradients would cost 5x the norm.
    const auto dtype = g.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    parts.push_back(max ? g.abs().max().to(at::kDouble)
                        : at::linalg_vector_norm(g, norm_type, c10::nullopt, false, dtype)
                              .to(at::kDouble)
                              .pow(norm_type));
  }
  at::Tensor local = parts.empty() ? at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device))
                                   : (max ? at::stack(parts).max() : at::stack(parts).sum());
  const at::Tensor nan = at::isnan(local);
  at::Tensor acc = at::stack({at::where(nan, at::zeros_like(local), local), nan.to(at::kDouble)});
  if (comm && comm->size() > 1) comm->all_reduce(acc, max ? ReduceOp::Max : ReduceOp::Sum);
  acc = acc.cpu();
  const double v = acc[0].item<double>();
  double total = acc[1].item<double>() > 0 ? std::nan("")
                 : max || norm_type == 1 ? v
                 : norm_type == 2        ? std::sqrt(v)
                                         : std::pow(v, 1.0 / norm_type);
  if (error_if_nonfinite && !std::isfinite(total))
    throw Error("clip_grad_norm_: the total norm of order " + norm_text(norm_type) + " of the gradients is " +
                norm_text(total) +
                ", so it cannot be clipped (a NaN or inf gradient on some rank); pass error_if_nonfinite = false to "
                "scale them by the non-finite norm anyway, as torch does");
  return total;
}

double clip_coefficient(double max_norm, double total) {
  const double coef = max_norm / (total + 1e-6);
  return coef < 1.0 ? coef : (std::isnan(coef) ? coef : 1.0);
}

void scale_pieces(const std::vector<GradPiece>& pieces, double coef) {
  if (coef == 1.0) return;  // torch multiplies by 1 too: nothing changes
  at::NoGradGuard no_grad;
  for (const auto& p : pieces)
    if (p.grad.defined()) p.grad.mul_(coef);
}

double clip_pieces(const std::vector<GradPiece>& pieces, Communicator* comm, double max_norm, double norm_type,
                   bool error_if_nonfinite) {
  const double total = pieces_norm(pieces, comm, norm_type, error_if_nonfinite);
  scale_pieces(pieces, clip_coefficient(max_norm, total));
  return total;
}

}  // namespace shardplan
