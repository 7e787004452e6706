#pragma once
// Internal: the core of shardplan/clip_grad.h over "pieces" of gradient, so
// every kind of model (torch::nn, TorchScript, DataParallel's buckets, ZeRO-1
// slices, mixed precision's float32 masters) only says which tensors it holds
// and which of their elements this rank counts.
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace shardplan {

class Communicator;
class Mesh;
class World;
struct ReportRow;

struct GradPiece {
  at::Tensor grad;
  bool counts = true;  // this rank counts these elements in the total
};

// The norm of the counted elements of every rank's pieces: sum |g|^p (inf:
// max |g|) locally (per piece torch's norm, summed in float64), one
// all-reduce over `world` (or none when `comm` is nullptr: a single
// process), then ^(1/p). NaN if any counted element is NaN, inf if any is
// inf (as torch). With error_if_nonfinite every rank throws the same Error
// when the total is not finite. Checks norm_type before communicating.
double pieces_norm(const std::vector<GradPiece>& pieces, World& world, double norm_type, bool error_if_nonfinite);
double pieces_norm(const std::vector<GradPiece>& pieces, Communicator* comm, double norm_type,
                   bool error_if_nonfinite);

// Scales every piece, counted or not, by `coef` (torch multiplies even by 1;
// so do we, which keeps NaN/inf gradients as torch leaves them).
void scale_pieces(const std::vector<GradPiece>& pieces, double coef);
// torch's coefficient: min(1, max_norm / (total + 1e-6)).
double clip_coefficient(double max_norm, double total);
// pieces_norm, then scale_pieces by torch's coefficient; returns the norm.
double clip_pieces(const std::vector<GradPiece>& pieces, Communicator* comm, double max_norm, double norm_type,
                   bool error_if_nonfinite);

// Throws shardplan::Error naming the argument: max_norm NaN or negative,
// norm_type NaN or <= 0. Before any communication.
void check_clip_args(double max_norm, double norm_type, const char* who);
void check_norm_type(double norm_type, const char* who);

// The ownership rule of shardplan/clip_grad.h for one report row, on every
// mesh axis of size > 1. `skip_axis` (may be "") is ignored: a caller that
// decides that axis itself (DataParallel's batch axis).
bool counts_on_this_rank(const ReportRow& row, const Mesh& mesh, int world_rank);
bool counts_on_this_rank(const ReportRow& row, const Mesh& mesh, int world_rank, const std::string& skip_axis);
// And a second such axis (a pipeline's: each stage counts its own parameters).
bool counts_on_this_rank(const ReportRow& row, const Mesh& mesh, int world_rank, const std::string& skip_axis,
                         const std::string& skip_axis2);

}  // namespace shardplan
