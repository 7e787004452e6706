// ZeRO-3 over the batch axis (`data_parallel: {zero: 3}`), FSDP's way:
// every shardplan::nn layer's own averaged parameters form a unit whose
// bucket holds, on this rank, only its 1/D slice of them (Bucket::params).
// The layer's gate (shardplan/nn/param_gate.h) all-gathers the unit before
// its forward and frees it after, and gathers it again when backward reaches
// the layer; the unit is freed again once its gradients have all arrived
// (at the next gate or the end of backward: autograd's AccumulateGrad still
// reads the parameter's shape right after our gradient hook), and the
// gradients are reduce-scattered as ZeRO-1's are. The parameters keep
// their identity throughout (optimizer, hooks, autograd's saved leaves):
// only their storage is swapped with Tensor::set_data; a free parameter keeps
// its shape over a single NaN (release_unit).
#include <torch/csrc/autograd/engine.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <set>

#include "data_parallel_impl.h"
#include "shardplan/error.h"

namespace shardplan {
namespace {

class Zero3Gate : public nn::ParamGate {
 public:
  Zero3Gate(std::weak_ptr<DataParallel::Impl> impl, size_t unit) : impl_(std::move(impl)), unit_(unit) {}
  void before_forward() override {
    if (auto d = impl_.lock()) {
      d->gather_unit(unit_);
      d->prefetch_after(unit_, +1);
    }
  }
  void after_forward() override {
    if (auto d = impl_.lock()) {
      std::lock_guard<std::mutex> lock(d->mu);
      d->release_unit(unit_);
    }
  }
  void before_backward() override {
    if (auto d = impl_.lock()) {
      d->release_done_units(unit_);
      d->gather_unit(unit_);
      d->prefetch_after(unit_, -1);
    }
  }

 private:
  std::weak_ptr<DataParallel::Impl> impl_;
  size_t unit_;
};

}  // namespace

void DataParallel::Impl::plan_units(const std::vector<GatedLayerInfo>& layers,
                                    const std::vector<std::pair<std::string, at::Tensor>>& parameters) {
  std::map<const void*, int> paths_of;
  for (const auto& [name, p] : parameters) ++paths_of[p.unsafeGetTensorImpl()];
  std::map<std::string, const at::Tensor*> averaged_by_name;
  for (const auto& [name, p] : to_average) averaged_by_name[name] = &p;
  for (const auto& l : layers) {
    Unit u;
    u.layer = l.path;
    u.gated = l.layer;
    bool any = false;
    for (const std::string& name : l.params) {
      const auto it = averaged_by_name.find(name);
      // Ignored, frozen, split over the batch axis, or tied to another path
      // (used by two layers' forwards, or outside any): kept whole.
      if (it == averaged_by_name.end() || paths_of[it->second->unsafeGetTensorImpl()] > 1) continue;
      unit_of_path[name] = static_cast<int>(units.size());
      any = true;
    }
    if (any) units.push_back(std::move(u));
  }
}

// This rank's slice of bucket `b` takes the values of the parameters'
// elements it covers, read straight from each parameter's overlapping range:
// no flat copy of the whole unit is made (at construction the parameters may
// be a whole shard over DeferredInit's zero page, which must stay unread).
void DataParallel::Impl::write_slice(Bucket& b) const {
  const int64_t n = b.params.numel(), lo = rank * n;
  for (size_t i : b.entries) {
    const Entry& e = entries[i];
    const int64_t begin = std::max(e.offset, lo), end = std::min(e.offset + e.numel, lo + n);
    if (begin < end)
      b.params.narrow(0, begin - lo, end - begin).copy_(e.param.detach().reshape(-1).narrow(0, begin - e.offset, end - begin));
  }
}

void DataParallel::Impl::shard_units() {
  torch::NoGradGuard no_grad;
  for (size_t bi = 0; bi < buckets.size(); ++bi) {
    Bucket& b = buckets[bi];
    if (b.unit < 0) continue;
    b.params = at::zeros({b.info.padded / size}, b.options);  // its padding stays 0
    write_slice(b);
    units[b.unit].bucket = bi;
    prefetch_window_bytes = std::max(prefetch_window_bytes, 2 * b.info.padded * b.params.element_size());
  }
  for (size_t u = 0; u < units.size(); ++u) {
    release_unit(u);
    units[u].gated->set_param_gate(std::make_shared<Zero3Gate>(self, u));
  }
}

void DataParallel::Impl::remove_gates() {
  for (auto& u : units) u.gated->set_param_gate(nullptr);
}

namespace {

// A fresh buffer each time: a view of the last one that autograd saved (a
// weight's transpose) keeps reading what it saw.
std::unique_ptr<Work> start_gather(const DataParallel::Impl& d, const DataParallel::Impl::Bucket& b,
                                   at::Tensor& into) {
  torch::NoGradGuard no_grad;
  into = at::empty({b.info.padded}, b.params.options());
  if (d.group && d.size > 1) return d.group->all_gather_async(b.params, into);
  into.copy_(b.params);
  return nullptr;
}

}  // namespace

void DataParallel::Impl::gather_unit(size_t u) {
  std::lock_guard<std::mutex> lock(mu);
  Unit& un = units[u];
  un.arrived = 0;
  un.done = false;
  if (un.whole) return;
  torch::NoGradGuard no_grad;
  Bucket& b = buckets[un.bucket];
  at::Tensor whole;
  ++gather_stats.gathers;
  if (un.incoming.defined()) ++gather_stats.prefetched;
  std::unique_ptr<Work> work = un.incoming.defined() ? std::move(un.prefetch) : start_gather(*this, b, whole);
  if (un.incoming.defined()) whole = std::move(un.incoming);
  un.incoming = at::Tensor();
  if (work) {
    const auto t0 = std::chrono::steady_clock::now();
    work->wait();
    gather_stats.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  for (size_t i : b.entries) {
    Entry& e = entries[i];
    e.param.set_data(whole.narrow(0, e.offset, e.numel).view(e.sizes));
  }
  un.whole = true;
}

void DataParallel::Impl::prefetch_after(size_t u, int direction) {
  std::lock_guard<std::mutex> lock(mu);
  note_peaks();  // u just gathered (a gate's path: WholeParameters' gathers are not counted)
  if (!order_known) {  // the first forward: learn the order
    if (direction > 0 && units[u].position < 0) {
      units[u].position = static_cast<int>(order.size());
      order.push_back(u);
    }
    return;
  }
  if (!prefetch || hold > 0 || units[u].position < 0) return;
  // Ahead by bytes, not by units: a LayerNorm's unit computes for far less
  // time than the next matmul's takes to gather, so one unit ahead left the
  // big gathers after small units exposed. The next unit is always started;
  // more while what is whole or in flight ahead of u stays within the window.
  int64_t ahead = 0;
  for (int next = units[u].position + direction; next >= 0 && next < static_cast<int>(order.size());
       next += direction) {
    Unit& un = units[order[next]];
    const int64_t bytes = buckets[un.bucket].info.padded * buckets[un.bucket].params.element_size();
    if (ahead > 0 && ahead + bytes > prefetch_window_bytes) return;
    ahead += bytes;
    if (un.whole || un.incoming.defined()) continue;
    un.prefetch = start_gather(*this, buckets[un.bucket], un.incoming);
  }
  note_peaks();
}

void DataParallel::Impl::note_peaks() {
  int64_t bytes = 0, in_flight = 0;
  for (const Unit& un : units) {
    if (!un.whole && !un.incoming.defined()) continue;
    bytes += buckets[un.bucket].info.padded * buckets[un.bucket].params.element_size();
    in_flight += un.incoming.defined() ? 1 : 0;
  }
  gather_stats.peak_whole_bytes = std::max(gather_stats.peak_whole_bytes, bytes);
  gather_stats.most_in_flight = std::max(gather_stats.most_in_flight, in_flight);
}

// A prefetch no gate used (a forward that stopped early, a unit backward
// skipped) is waited for and dropped before the slices change.
void DataParallel::Impl::drop_prefetches() {
  for (auto& un : units) {
    if (un.prefetch) un.prefetch->wait();
    un.prefetch.reset();
    un.incoming = at::Tensor();
  }
}

void DataParallel::Impl::release_unit(size_t u) {
  Unit& un = units[u];
  if (!un.whole || hold > 0) return;
  const Bucket& b = buckets[un.bucket];
  // One NaN broadcast over the parameter's shape (stride 0): the memory is
  // gone, but the shape stays, which autograd checks gradients against (an
  // AccumulateGrad node made while the parameter is free, as a recomputed
  // region's is) and code that only reads shapes may see; a read of the
  // values gives NaN, not a plausible number.
  const at::Tensor nan = at::full({1}, std::numeric_limits<double>::quiet_NaN(), b.params.options());
  for (size_t i : b.entries) {
    Entry& e = entries[i];
    e.param.set_data(nan.expand(e.sizes));
  }
  un.whole = false;
  un.done = false;
}

void DataParallel::Impl::release_done_units(size_t except) {
  std::lock_guard<std::mutex> lock(mu);
  for (size_t u = 0; u < units.size(); ++u)
    if (u != except && units[u].done) release_unit(u);
}

void DataParallel::Impl::release_all_units() {
  drop_prefetches();
  for (size_t u = 0; u < units.size(); ++u) release_unit(u);
  release_queued = false;
}

void DataParallel::Impl::hold_whole() {
  {
    std::lock_guard<std::mutex> lock(mu);
    drop_prefetches();
  }
  for (size_t u = 0; u < units.size(); ++u) gather_unit(u);
  std::lock_guard<std::mutex> lock(mu);
  ++hold;
}

void DataParallel::Impl::unhold_whole() {
  std::lock_guard<std::mutex> lock(mu);
  if (--hold > 0) return;
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < units.size(); ++u) {
    write_slice(buckets[units[u].bucket]);
    release_unit(u);
  }
}

DataParallel::WholeParameters::WholeParameters(const DataParallel& dp) : dp_(dp) {
  if (dp_.impl().stage3()) dp_.impl().hold_whole();
}

DataParallel::WholeParameters::~WholeParameters() {
  if (dp_.impl().stage3()) dp_.impl().unhold_whole();
}

DataParallel::GatherStats DataParallel::gather_stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->gather_stats;
}

// Under mu. NoSync backwards end without complete(): a callback frees the
// units then all the same.
void DataParallel::Impl::note_unit_grad(const Entry& e) {
  if (e.unit < 0) return;
  Unit& un = units[e.unit];
  if (++un.arrived == buckets[un.bucket].entries.size()) un.done = true;
  if (release_queued) return;
  release_queued = true;
  torch::autograd::Engine::get_default_engine().queue_callback([weak = self] {
    if (auto impl = weak.lock()) {
      std::lock_guard<std::mutex> lock(impl->mu);
      impl->release_all_units();
    }
  });
}

}  // namespace shardplan
