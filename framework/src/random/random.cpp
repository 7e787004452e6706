#include "shardplan/random.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <mutex>
#include <utility>

#include "dropout_masks.h"
#include "shardplan/error.h"
#include "shardplan/world.h"

namespace shardplan {

namespace {

// Ranks that are threads each have their own tracker and fork nesting.
thread_local std::shared_ptr<RngTracker> tl_tracker;
thread_local std::vector<std::string> tl_forks;

Mesh world_mesh(const World& world) { return Mesh({{"world", world.size()}}); }

uint64_t sharded_seed(uint64_t seed, const Mesh& mesh, int rank, const std::string& axis) {
  return seed + 2718u + static_cast<uint64_t>(mesh.coord(rank, axis)) +
         7919u * static_cast<uint64_t>(mesh.axis_index(axis));
}

}  // namespace

RngTracker::RngTracker(uint64_t seed, Mesh mesh, int rank)
    : seed_(seed), mesh_(std::move(mesh)), rank_(rank), replicated_(at::detail::createCPUGenerator(seed)) {
  if (mesh_.ndim() == 0) throw Error("RngTracker: the mesh has no axes");
  if (rank_ < 0 || rank_ >= mesh_.size())
    throw Error("RngTracker: rank " + std::to_string(rank_) + " is outside mesh " + mesh_.str());
}

const std::string& RngTracker::default_axis() const { return mesh_.axes().back().first; }

at::Generator& RngTracker::sharded(const std::string& axis) {
  auto it = sharded_.find(axis);
  if (it != sharded_.end()) return it->second;
  if (!mesh_.has_axis(axis))
    throw Error("dropout forked over mesh axis '" + axis + "', which mesh " + mesh_.str() + " does not have");
  return sharded_.emplace(axis, at::detail::createCPUGenerator(sharded_seed(seed_, mesh_, rank_, axis)))
      .first->second;
}

at::Generator& RngTracker::current() { return tl_forks.empty() ? replicated_ : sharded(tl_forks.back()); }

void RngTracker::set_mesh(Mesh mesh) {
  if (mesh.str() == mesh_.str()) return;
  if (mesh.size() != mesh_.size())
    throw Error("RngTracker: mesh " + mesh.str() + " has " + std::to_string(mesh.size()) + " ranks, the tracker's " +
                mesh_.str() + " has " + std::to_string(mesh_.size()));
  mesh_ = std::move(mesh);
  sharded_.clear();
}

std::map<std::string, at::Tensor> RngTracker::get_states() const {
  std::map<std::string, at::Tensor> out;
  auto state_of = [](const at::Generator& g) {
    at::Generator gen = g;
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state();
  };
  out.emplace("", state_of(replicated_));
  for (const auto& kv : sharded_) out.emplace(kv.first, state_of(kv.second));
  return out;
}

void RngTracker::set_states(const std::map<std::string, at::Tensor>& states) {
  for (const auto& kv : states) {
    at::Generator& g = kv.first.empty() ? replicated_ : sharded(kv.first);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(kv.second);
  }
}

std::shared_ptr<RngTracker> manual_seed(World& world, uint64_t seed, const Mesh& mesh) {
  auto t = std::make_shared<RngTracker>(seed, mesh.ndim() ? mesh : world_mesh(world), world.rank());
  if (t->mesh().size() != world.size())
    throw Error("manual_seed: mesh " + t->mesh().str() + " has " + std::to_string(t->mesh().size()) +
                " ranks, the world " + std::to_string(world.size()));
  t->owner = world.comm_ptr();
  tl_tracker = t;
  return t;
}

uint64_t broadcast_seed(World& world, uint64_t seed) {
  // Through int64: every backend reduces and moves it, not all know uint64.
  at::Tensor t = at::tensor(static_cast<int64_t>(seed), at::kLong);
  world.comm().broadcast(t, 0);
  return static_cast<uint64_t>(t.item<int64_t>());
}

RngTracker* current_rng_tracker() { return current_rng_tracker_ptr().get(); }

std::shared_ptr<RngTracker> current_rng_tracker_ptr() {
  if (!tl_tracker) return nullptr;
  if (tl_tracker->owner.expired()) {
    // A tracker made without a world (RngTrackerScope with a hand-made one)
    // has never had an owner and stays usable.
    std::weak_ptr<Communicator> empty;
    if (tl_tracker->owner.owner_before(empty) || empty.owner_before(tl_tracker->owner)) {
      tl_tracker.reset();
      return nullptr;
    }
  }
  return tl_tracker;
}

std::shared_ptr<RngTracker> ensure_rng_tracker(World& world, const Mesh& mesh) {
  auto t = current_rng_tracker_ptr();
  if (t && t->owner.lock() == world.comm_ptr()) {
    t->set_mesh(mesh);
    return t;
  }
  return manual_seed(world, at::detail::getDefaultCPUGenerator().current_seed(), mesh);
}

RngTrackerScope::RngTrackerScope(std::shared_ptr<RngTracker> tracker) : previous_(std::move(tl_tracker)) {
  tl_tracker = std::move(tracker);
}

RngTrackerScope::~RngTrackerScope() { tl_tracker = std::move(previous_); }

RngFork::RngFork() {
  if (RngTracker* t = current_rng_tracker()) {
    tl_forks.push_back(t->default_axis());
    active_ = true;
  }
}

RngFork::RngFork(std::string axis) {
  if (RngTracker* t = current_rng_tracker()) {
    t->sharded(axis);  // an unknown axis fails here, where the fork is written
    tl_forks.push_back(std::move(axis));
    active_ = true;
  }
}

RngFork::~RngFork() {
  if (active_) tl_forks.pop_back();
}

std::string current_rng_fork() { return tl_forks.empty() ? std::string() : tl_forks.back(); }

// Follows ATen's _dropout_impl (same checks, same early returns returning the
// input itself, same bernoulli_ / div_ / mul sequence), with the generator
// made explicit. Without a tracker that is torch's default generator, as
// at::dropout's on a CPU tensor.
at::Tensor dropout(const at::Tensor& input, double p, bool training, bool inplace) {
  TORCH_CHECK(p >= 0. && p <= 1., "dropout probability has to be between 0 and 1, but got ", p);
  RngTracker* t = current_rng_tracker();
  DropoutMaskScope::Mode mode;
  DropoutMasks* masks = detail::active_dropout_masks(&mode);
  if (!input.is_floating_point() || (!t && !input.device().is_cpu())) masks = nullptr;
  if (!t && !masks) {
    if (inplace) {
      at::Tensor x = input;
      return at::dropout_(x, p, training);
    }
    return at::dropout(input, p, training);
  }
  if (p == 0 || !training || input.numel() == 0) return input;
  if (p == 1) {
    if (inplace) {
      at::Tensor x = input;
      return x.mul_(at::zeros({}, input.options()));
    }
    return input.mul(at::zeros({}, input.options()));
  }
  at::Generator gen = t ? t->current() : at::detail::getDefaultCPUGenerator();
  at::Tensor noise;
  if (masks && mode == DropoutMaskScope::Mode::replay) {
    noise = detail::replay_dropout_mask(*masks, input, p, gen);
  } else {
    noise = at::empty(input.sizes(), input.options().device(at::kCPU).requires_grad(false));
    noise.bernoulli_(1 - p, gen);
    if (masks) detail::record_dropout_mask(*masks, noise, p, gen);
  }
  noise.div_(1 - p);
  if (!input.device().is_cpu()) noise = noise.to(input.device());
  if (inplace) {
    at::Tensor x = input;
    return x.mul_(noise);
  }
  return input.mul(noise);
}

}  // namespace shardplan
