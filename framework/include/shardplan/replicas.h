#pragma once
// The replica check for any sharded model: every parameter that should be
// identical across the ranks of a mesh axis (not split over it; the ranks
// sharing one piece of a `shared` split) is compared by a checksum of its
// bytes. A drift usually comes from torch::nn::utils::clip_grad_norm_ on
// shards (use shardplan::clip_grad_norm_, shardplan/clip_grad.h), a
// rank-local random stream, or a non-deterministic kernel; the error says so.
//
// Collective over every mesh axis (every rank calls it): all the exchanges
// happen before any rank throws, and then every rank throws shardplan::Error
// (the rank that found the difference names the parameter, the axis and the
// ranks; the others name that rank), so no rank trains on alone.
// DataParallel::check_replicas() is the same check, its batch axis' ignored
// parameters excluded.
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
class TensorParallelImpl;
class Pipeline;

// A model sharded by parallelize(model, plan, world) with its report.
void check_replicas(torch::nn::Module& model, const ParallelReport& report, World& world);
// A TorchScript module sharded by parallelize_script (its module and report).
void check_replicas(torch::jit::Module& model, const ParallelReport& report, World& world);
// The in-process wrapper: compares the replicas of each parameter across
// its ranks' copies (the copies it does not expose follow their holder).
void check_replicas(TensorParallelImpl& tp);
// A pipelined model (shardplan/pipeline.h): this rank's stage's parameters,
// over every axis but the pipe axis. Collective over the world.
void check_replicas(Pipeline& pipe, const ParallelReport& report, World& world);

}  // namespace shardplan
