#include "shardplan/state_bytes.h"

#include <torch/torch.h>

#include <unordered_set>

#include "data_parallel/data_parallel_impl.h"
#include "shardplan/optimizer.h"

namespace shardplan {
namespace {

// Counts each storage once: a .grad that is a view of a bucket, a segment
// that is a view of a slice.
class StorageSet {
 public:
  int64_t add(const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return 0;
    const auto& s = t.storage();
    if (!seen_.insert(s.unsafeGetStorageImpl()).second) return 0;
    return static_cast<int64_t>(s.nbytes());
  }

 private:
  std::unordered_set<const void*> seen_;
};

void add_state(torch::optim::Optimizer& o, StorageSet& seen, int64_t& n) {
  for (const auto& kv : o.state()) {
    auto* s = kv.second.get();
    if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(s)) {
      n += seen.add(a->exp_avg()) + seen.add(a->exp_avg_sq()) + seen.add(a->max_exp_avg_sq());
    } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(s)) {
      n += seen.add(w->exp_avg()) + seen.add(w->exp_avg_sq()) + seen.add(w->max_exp_avg_sq());
    } else if (auto* g = dynamic_cast<torch::optim::SGDParamState*>(s)) {
      n += seen.add(g->momentum_buffer());
    } else if (auto* r = dynamic_cast<torch::optim::RMSpropParamState*>(s)) {
      n += seen.add(r->square_avg()) + seen.add(r->momentum_buffer()) + seen.add(r->grad_avg());
    } else if (auto* ad = dynamic_cast<torch::optim::AdagradParamState*>(s)) {
      n += seen.add(ad->sum());
    }
  }
}

}  // namespace

StateBytes state_bytes(Optimizer& optimizer) {
  const DataParallel::Impl& d = optimizer.data_parallel().impl();
  StateBytes out;
  StorageSet seen;
  for (const auto& [name, p] : d.unique) out.params += seen.add(p);
  for (const auto& [name, p] : d.unique) out.grads += seen.add(p.grad());
  for (const auto& b : d.buckets)
    for (const at::Tensor* t : {&b.flat, &b.shard, &b.scattered, &b.carry, &b.wire, &b.wire_shard})
      out.grads += seen.add(*t);
  torch::optim::Optimizer& inner = optimizer.inner();
  for (const auto& group : inner.param_groups())
    for (const auto& t : group.params()) out.grads += seen.add(t.grad());
  add_state(inner, seen, out.optimizer);
  for (const auto& group : inner.param_groups())
    for (const auto& t : group.params()) out.copies += seen.add(t);
  return out;
}

}  // namespace shardplan
