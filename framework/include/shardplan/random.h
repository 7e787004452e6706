#pragma once
// Randomness under tensor parallelism (the idea of Megatron-core's
// CudaRNGStatesTracker, on the CPU and per thread).
//
// Ranks of one model-parallel group hold the same replicated activations, so
// a dropout mask over a replicated tensor must be the same on every rank, or
// the replicas silently diverge. A dropout over a sharded tensor (attention
// heads split over 'model', a column-parallel output kept split) must instead
// draw an independent mask on each rank, or every shard gets the same pattern.
// An RngTracker gives each rank two kinds of streams:
//   - replicated: seeded with `seed` on every rank;
//   - sharded along an axis: seeded with seed + 2718 + (this rank's
//     coordinate on that axis) + 7919 * (the axis' index in the mesh), as
//     Megatron's model-parallel seed, so it differs between ranks that differ
//     on that axis and agrees between ranks that differ only on other axes
//     (the same shard on two data-parallel replicas draws the same mask).
// Ranks that are threads share torch's global generator, so each rank owns
// its generators; the tracker in use is per thread.
//
// HOW A LAYER STRATEGY USES IT (LSTM inter-layer dropout, attention dropout):
//
//   #include "shardplan/random.h"
//   // replicated activations (e.g. LSTM output between layers, whole on
//   // every rank): same mask everywhere
//   y = shardplan::dropout(y, p, is_training());
//   // activations sharded over `axis` (e.g. attention weights of this rank's
//   // heads): independent masks
//   {
//     shardplan::RngFork fork(axis);   // the mesh axis the layer shards over
//     attn = shardplan::dropout(attn, p, is_training());
//   }
//
// With no tracker active on the thread (plain unsharded use), both are
// exactly torch::dropout with torch's global generator, so an unsharded layer
// stays bit-identical to its torch::nn twin; RngFork is then a no-op.
// parallelize() makes a tracker current on the calling thread (see
// ensure_rng_tracker below), so strategies need not look it up; a strategy
// that runs on other threads than parallelize()'s needs RngTrackerScope.
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardplan/mesh.h"

namespace shardplan {

class Communicator;
class World;

// One rank's streams; used from one thread at a time (its rank's).
class RngTracker {
 public:
  // `mesh` is the layout of the world's ranks (size == world size); `rank` is
  // this rank in the world.
  RngTracker(uint64_t seed, Mesh mesh, int rank);

  uint64_t seed() const { return seed_; }
  const Mesh& mesh() const { return mesh_; }
  int rank() const { return rank_; }
  // The axis RngFork() without an argument forks over: the last mesh axis
  // (the fastest-varying one, where tensor parallelism conventionally sits).
  const std::string& default_axis() const;

  at::Generator& replicated() { return replicated_; }
  // Created on first use; throws shardplan::Error naming the mesh for an
  // unknown axis.
  at::Generator& sharded(const std::string& axis);
  // The stream dropout draws from on this thread now: sharded(axis) inside an
  // RngFork(axis), replicated() otherwise.
  at::Generator& current();

  // Re-targets the tracker to another mesh over the same ranks (parallelize()
  // does this with the plan's mesh). The replicated stream continues; the
  // sharded streams restart from their seeds when the mesh differs.
  void set_mesh(Mesh mesh);

  // Every stream's state, keyed "" for the replicated stream and by axis
  // name for the sharded streams created so far, e.g. to replay the same
  // masks when recomputing activations.
  std::map<std::string, at::Tensor> get_states() const;
  void set_states(const std::map<std::string, at::Tensor>& states);

  // Set by manual_seed()/parallelize(): the world this tracker belongs to.
  // current_rng_tracker() ignores a tracker whose world's communicator is
  // gone, so a stale one never leaks into later, unrelated code. Empty for a
  // tracker made by hand, which stays usable.
  std::weak_ptr<Communicator> owner;

 private:
  uint64_t seed_;
  Mesh mesh_;
  int rank_;
  at::Generator replicated_;
  std::map<std::string, at::Generator> sharded_;
};

// Makes a tracker with `seed` (must be the same on every rank; no
// communication) current on the calling thread for `world`, over `mesh`
// (default: one axis "world" of the world's size; parallelize() re-targets it
// to the plan's mesh). Returns it, e.g. to make it current on another thread
// with RngTrackerScope.
std::shared_ptr<RngTracker> manual_seed(World& world, uint64_t seed, const Mesh& mesh = Mesh());

// Rank 0's `seed`, broadcast to every rank (collective): agree on a seed that
// one rank chose, e.g. from a clock, then pass it to manual_seed().
uint64_t broadcast_seed(World& world, uint64_t seed);

// The tracker current on this thread, or nullptr (none set, or its world is
// gone).
RngTracker* current_rng_tracker();
std::shared_ptr<RngTracker> current_rng_tracker_ptr();

// Used by parallelize(): keeps this thread's tracker when it belongs to
// `world` (re-targeted to `mesh`), else makes a new one current with the seed
// of torch's default generator (torch::manual_seed, which ranks must call
// alike anyway to initialise identical models). No communication.
std::shared_ptr<RngTracker> ensure_rng_tracker(World& world, const Mesh& mesh);

// Makes `tracker` (may be null: none) current on this thread for the scope,
// restoring the previous one after.
class RngTrackerScope {
 public:
  explicit RngTrackerScope(std::shared_ptr<RngTracker> tracker);
  ~RngTrackerScope();
  RngTrackerScope(const RngTrackerScope&) = delete;
  RngTrackerScope& operator=(const RngTrackerScope&) = delete;

 private:
  std::shared_ptr<RngTracker> previous_;
};

// Within its scope, dropout on this thread draws from the tracker's stream
// sharded along `axis` (Megatron's `with tracker.fork():`). Nests; a no-op
// when no tracker is current.
class RngFork {
 public:
  RngFork();  // the tracker's default_axis()
  explicit RngFork(std::string axis);
  ~RngFork();
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  bool active_ = false;
};

// The axis of the innermost RngFork on this thread, or "" outside any.
std::string current_rng_fork();

// torch::dropout / torch::dropout_ (inplace) with torch's checks and scaling.
// Without a current tracker: exactly torch's (global generator). With one:
// the mask is drawn from current_rng_tracker()->current(); on a non-CPU
// tensor the mask is drawn on the CPU and moved to the tensor's device.
at::Tensor dropout(const at::Tensor& input, double p, bool training, bool inplace = false);

// The dropout masks of one run of a recomputed region (shardplan/recompute.h),
// kept as bits so that backward's rerun takes them back instead of drawing
// them again: on the CPU a draw is a serial Mersenne twister, slower than
// all the rest of attention's core (docs/BENCHMARKS.md, activation
// recomputation). One bit per element is 1/32 of a float32 mask.
struct DropoutMasks {
  struct Mask {
    at::Tensor bits;  // uint8, bit i of byte i / 8: element i kept
    std::vector<int64_t> sizes;
    at::ScalarType dtype;
    double p;
    at::Tensor stream_after;  // the state of the stream it was drawn from, after the draw
  };
  std::vector<Mask> masks;
  size_t next = 0;  // the next one to replay
};

// Within its scope, dropout on this thread (with a tracker, or without one on
// a CPU tensor) appends each mask it draws to `masks` (record), or takes the
// next one instead of drawing and leaves the stream as the draw left it
// (replay), so the masks and every later draw are bit-identical to the
// recorded run's. A replay that asks for another shape or probability than
// was recorded, or for more masks, is an Error. Nests (innermost wins).
class DropoutMaskScope {
 public:
  enum class Mode { record, replay };
  DropoutMaskScope(DropoutMasks& masks, Mode mode);
  ~DropoutMaskScope();
  DropoutMaskScope(const DropoutMaskScope&) = delete;
  DropoutMaskScope& operator=(const DropoutMaskScope&) = delete;

 private:
  DropoutMasks* previous_;
  Mode previous_mode_;
};

}  // namespace shardplan
