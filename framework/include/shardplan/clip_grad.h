#pragma once
// Gradient norms and clipping for sharded models: the total norm of the
// UNSHARDED model's gradient, every element counted exactly once, the same
// on every rank, and the same clipping coefficient everywhere, so a sharded
// run follows torch::nn::utils::clip_grad_norm_ on the unsharded model.
//
// torch's clip_grad_norm_ on a rank's own parameters is wrong under tensor
// parallelism: each rank sees only its shards (the norm is too small) and
// counts a replicated parameter as if it were the whole model's, so the
// ranks clip by different coefficients and their replicas drift apart.
//
// Which rank counts an element (for each mesh axis of size > 1): a parameter
// split over the axis counts on every rank of it (its shards are disjoint),
// except the pieces of a `shared` split (grouped-query attention's kv heads
// held by several ranks), which count on the first rank of each sharing
// group; a parameter not split over the axis is a replica there and counts
// on coordinate 0 only. Tied parameters count once (under their first path).
// Sequence-parallel norm weights are replicas (their gradients are summed
// over the axis in backward). Parameters without a gradient are skipped, as
// torch does.
//
// Each rank sums |g|^p of the elements it counts (each tensor's norm as
// torch's clip computes it, in float32 at least, the sum in float64), one
// all-reduce over the world adds (inf: maximises) the partial sums, and every
// rank scales every gradient it holds, counted or not, by torch's
// coefficient min(1, max_norm / (total + 1e-6)). With
// error_if_nonfinite every rank throws alike when the total is NaN or inf
// (decided after the reduction, so no rank is left waiting).
//
// Every function here is collective over the world (all ranks call it with
// the same arguments), except the TensorParallel ones, which are local.
// Bad arguments (max_norm or norm_type NaN, norm_type <= 0, a report that does
// not describe the model) throw shardplan::Error before any communication.
//
//   loss.backward();
//   double norm = shardplan::clip_grad_norm_(*model, report, *world, 1.0);
//   opt.step();
#include <cmath>

namespace torch {
namespace nn {
class Module;
}
namespace jit {
struct Module;
}
}  // namespace torch

namespace shardplan {

struct ParallelReport;
class World;
class DataParallel;
class Optimizer;
class TensorParallelImpl;
class Pipeline;

// A model sharded by parallelize(model, plan, world) (`report` is what it
// returned). Reads .grad: under data parallelism the averaged gradients
// (non-ZeRO: after backward), for ZeRO-1 use the DataParallel overload.
double grad_norm(torch::nn::Module& model, const ParallelReport& report, World& world, double norm_type = 2.0,
                 bool error_if_nonfinite = false);
double clip_grad_norm_(torch::nn::Module& model, const ParallelReport& report, World& world, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);

// A TorchScript module sharded by parallelize_script (its ScriptParallel's
// module and report).
double grad_norm(torch::jit::Module& model, const ParallelReport& report, World& world, double norm_type = 2.0,
                 bool error_if_nonfinite = false);
double clip_grad_norm_(torch::jit::Module& model, const ParallelReport& report, World& world, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);

// The gradient a DataParallel averaged over its batch axis: the global
// batch's gradient. Completes the averaging first when backward's end has
// not (DataParallel::finish(); an error inside NoSync). Without ZeRO the
// averaged .grad, with ZeRO-1 the reduced slices its ZeroOptimizer steps
// with. Parameters in data_parallel.ignore are not averaged, so each rank's
// gradient of them is its own (as expert parameters): they count on every
// rank of the batch axis.
double grad_norm(DataParallel& dp, double norm_type = 2.0, bool error_if_nonfinite = false);
double clip_grad_norm_(DataParallel& dp, double max_norm, double norm_type = 2.0, bool error_if_nonfinite = false);

// What a shardplan::Optimizer steps with (plain or ZeRO-1): with float32
// master weights (shardplan/mixed_precision.h) the masters' float32
// gradients, and with a loss scaler unscaled first (Optimizer::unscale_, as
// torch's GradScaler.unscale_ before clipping; step() then does not unscale
// again). With ZeRO-1 and a loss scaler use this overload, not the
// DataParallel one: the slices it scales are the ones step() reads. Over a
// pipeline stage's DataParallel (Pipeline::data_parallel(), or one built
// from Pipeline::named_parameters() under the pipelined plan) every stage
// counts its own parameters: the norm over every stage.
double grad_norm(Optimizer& opt, double norm_type = 2.0, bool error_if_nonfinite = false);
double clip_grad_norm_(Optimizer& opt, double max_norm, double norm_type = 2.0, bool error_if_nonfinite = false);

// A pipelined model (shardplan/pipeline.h), after Pipeline::step: the
// norm over every stage, each rank counting its stage's parameters by the
// rule above on the other axes (a tensor tied across stages once, under its
// first path). `report` is parallelize()'s for the model. Throws before any
// communication under ZeRO, whose slices this does not read: use the
// Optimizer overload over the stage's DataParallel there.
double grad_norm(Pipeline& pipe, const ParallelReport& report, World& world, double norm_type = 2.0,
                 bool error_if_nonfinite = false);
double clip_grad_norm_(Pipeline& pipe, const ParallelReport& report, World& world, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);

// The in-process wrapper: its parameters() already hold each element once,
// so this is torch's clip_grad_norm_ over them (float64 accumulation); no
// communication.
double grad_norm(TensorParallelImpl& tp, double norm_type = 2.0, bool error_if_nonfinite = false);
double clip_grad_norm_(TensorParallelImpl& tp, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

}  // namespace shardplan
