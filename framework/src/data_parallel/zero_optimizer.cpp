#include "shardplan/zero_optimizer.h"

#include <torch/torch.h>

#include "data_parallel_impl.h"
#include "shardplan/error.h"

#include <algorithm>

namespace shardplan {
namespace {

// Updates that read each element of a parameter alone: on a slice they do
// exactly what they do on the whole tensor.
std::string elementwise_name(torch::optim::Optimizer& o) {
  if (dynamic_cast<torch::optim::Adam*>(&o)) return "Adam";
  if (dynamic_cast<torch::optim::AdamW*>(&o)) return "AdamW";
  if (dynamic_cast<torch::optim::SGD*>(&o)) return "SGD";
  if (dynamic_cast<torch::optim::RMSprop*>(&o)) return "RMSprop";
  if (dynamic_cast<torch::optim::Adagrad*>(&o)) return "Adagrad";
  return "";
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(DataParallel& dp, const Factory& make) : dp_(dp) {
  DataParallel::Impl& d = *dp.impl_;
  if (!d.zero)
    throw Error("ZeroOptimizer needs a plan with data_parallel: {zero: 1 or 2}; this plan reduces whole gradients, "
                "so use a plain torch optimizer");
  if (d.zero_attached) throw Error("ZeroOptimizer: this DataParallel already has one");
  // This rank's slice of each bucket's parameters, flattened in bucket order,
  // and a view of it per parameter it overlaps: the optimizer's tensors.
  // With master weights the slice is their copy (the buckets have the
  // masters' dtype); without, the views are of the model's parameters
  // themselves, so ZeRO keeps no second copy of them (shards_ undefined).
  std::vector<at::Tensor> shards, params;
  std::vector<std::vector<Segment>> segments;
  for (auto& b : d.buckets) {
    const int64_t n = b.info.padded / d.size, lo = d.rank * n;
    if (b.params.defined()) {
      // ZeRO-3: the unit's slice is the parameters' only copy; step it in place.
      shards.push_back(b.params);
    } else if (d.main()) {
      std::vector<at::Tensor> parts;
      for (size_t i : b.entries) parts.push_back(d.entries[i].param.detach().reshape(-1));
      at::Tensor flat = at::cat(parts).to(b.info.dtype);
      if (b.info.padded > b.info.numel) flat = at::cat({flat, at::zeros({b.info.padded - b.info.numel}, flat.options())});
      shards.push_back(flat.narrow(0, lo, n).clone());
    } else {
      shards.emplace_back();
    }
    segments.emplace_back();
    for (size_t m = 0; m < b.entries.size(); ++m) {
      const auto& e = d.entries[b.entries[m]];
      const int64_t begin = std::max(e.offset, lo), end = std::min(e.offset + e.numel, lo + n);
      if (begin >= end) continue;
      // A leaf of its own (the slice requires no gradient) whose in-place
      // updates land in the slice (or the parameter).
      at::Tensor view = shards.back().defined() ? shards.back().narrow(0, begin - lo, end - begin)
                                                : e.param.detach().view(-1).narrow(0, begin - e.offset, end - begin);
      view.requires_grad_(true);
      segments.back().push_back(Segment{view, m, begin - lo});
      params.push_back(view);
    }
  }
  auto inner = make(params);
  if (!inner) throw Error("ZeroOptimizer: the factory returned no optimizer");
  if (elementwise_name(*inner).empty())
    throw Error("ZeroOptimizer supports element-wise optimizers only (Adam, AdamW, SGD, RMSprop, Adagrad): an "
                "update that reads the whole parameter cannot run on a 1/D slice");
  // Only now, with nothing left to refuse, does anything change.
  inner_ = std::move(inner);
  shards_ = std::move(shards);
  segments_ = std::move(segments);
  d.zero_attached = true;
}

ZeroOptimizer::~ZeroOptimizer() { dp_.impl_->zero_attached = false; }

torch::optim::Optimizer& ZeroOptimizer::inner() { return *inner_; }

int64_t ZeroOptimizer::state_bytes() const { return optimizer_state_bytes(*inner_); }

// Without masters the slice is assembled from the parameters' views: a copy.
at::Tensor ZeroOptimizer::slice(size_t i) const {
  if (shards_[i].defined()) return shards_[i];
  const DataParallel::Impl& d = *dp_.impl_;
  const auto& b = d.buckets[i];
  std::vector<at::Tensor> parts;
  int64_t used = 0;
  for (const auto& s : segments_[i]) {
    parts.push_back(s.tensor.detach());
    used += s.tensor.numel();
  }
  const int64_t n = b.info.padded / d.size;
  if (used < n) parts.push_back(at::zeros({n - used}, b.options));
  return at::cat(parts);
}

std::vector<ZeroOptimizer::Bucket> ZeroOptimizer::layout() const {
  const DataParallel::Impl& d = *dp_.impl_;
  std::vector<Bucket> out;
  for (size_t i = 0; i < d.buckets.size(); ++i) {
    Bucket b;
    b.slice = slice(i);
    b.padded = d.buckets[i].info.padded;
    for (size_t k : d.buckets[i].entries) b.members.emplace_back(d.entries[k].param, d.entries[k].offset);
    b.segments = segments_[i];
    out.push_back(std::move(b));
  }
  return out;
}

void ZeroOptimizer::zero_grad() {
  DataParallel::Impl& d = *dp_.impl_;
  if (d.main()) d.discard_main_grads();
  prepared_ = false;
  d.zero_unconsumed = false;
  for (auto& e : d.entries)
    if (e.param.grad().defined()) e.param.mutable_grad() = at::Tensor();
  for (auto& b : segments_)
    for (auto& s : b) s.tensor.mutable_grad() = at::Tensor();
  std::fill(d.zero_used.begin(), d.zero_used.end(), false);
}

void ZeroOptimizer::prepare() {
  if (prepared_) return;
  DataParallel::Impl& d = *dp_.impl_;
  dp_.finish();  // nothing to do when backward's end averaged already
  d.zero_unconsumed = false;
  // A parameter no rank used since the last step keeps no gradient, so the
  // optimizer leaves it (and its state) alone, as one process would.
  for (size_t i = 0; i < d.buckets.size(); ++i)
    for (auto& s : segments_[i]) {
      const size_t k = d.buckets[i].entries[s.member];
      const bool used = k < d.zero_used.size() && d.zero_used[k];
      s.tensor.mutable_grad() = used ? d.buckets[i].shard.narrow(0, s.begin, s.tensor.numel()).clone() : at::Tensor();
    }
  std::fill(d.zero_used.begin(), d.zero_used.end(), false);
  prepared_ = true;
}

std::vector<at::Tensor> ZeroOptimizer::slice_grads() {
  prepare();
  std::vector<at::Tensor> out;
  for (auto& b : segments_)
    for (auto& s : b) out.push_back(s.tensor.grad());
  return out;
}

void ZeroOptimizer::skip_step() {
  prepare();
  prepared_ = false;
  for (auto& b : segments_)
    for (auto& s : b) s.tensor.mutable_grad() = at::Tensor();
}

bool ZeroOptimizer::masters() const { return dp_.impl_->main(); }

std::vector<std::pair<at::Tensor, at::Tensor>> ZeroOptimizer::gather_masters() {
  DataParallel::Impl& d = *dp_.impl_;
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  for (size_t i = 0; i < d.buckets.size(); ++i) {
    auto& b = d.buckets[i];
    at::Tensor whole = at::empty({b.info.padded}, shards_[i].options().requires_grad(false));
    if (d.group && d.size > 1)
      d.group->all_gather_async(shards_[i].detach(), whole)->wait();
    else
      whole.copy_(shards_[i].detach());
    for (size_t k : b.entries) {
      auto& e = d.entries[k];
      out.emplace_back(e.param, whole.narrow(0, e.offset, e.numel).view(e.sizes));
    }
  }
  return out;
}

void ZeroOptimizer::step() {
  DataParallel::Impl& d = *dp_.impl_;
  prepare();
  prepared_ = false;
  {
    torch::NoGradGuard no_grad;
    inner_->step();
  }
  // Consumed: no gradient slice outlives the step (prepare() makes them again).
  for (auto& b : segments_)
    for (auto& s : b) s.tensor.mutable_grad() = at::Tensor();
  // ZeRO-3's units are gathered by their next forward, from the slices just
  // stepped; anything still whole would be stale.
  {
    std::lock_guard<std::mutex> lock(d.mu);
    d.release_all_units();
  }
  // ZeRO-1 gathers into the buckets' buffers; ZeRO-2 has none between
  // steps, so into one per bucket, the next gather running while this one is
  // copied into the model and freed.
  const size_t n = d.buckets.size();
  std::vector<at::Tensor> whole(n);
  std::vector<std::unique_ptr<Work>> works(n);
  torch::NoGradGuard no_grad;
  auto install = [&](size_t i) {
    if (works[i]) works[i]->wait();
    auto& b = d.buckets[i];
    if (b.params.defined()) return;
    for (size_t k : b.entries) {
      auto& e = d.entries[k];
      e.param.copy_(whole[i].narrow(0, e.offset, e.numel).view(e.sizes));
    }
    whole[i].reset();
  };
  for (size_t i = 0; i < n; ++i) {
    auto& b = d.buckets[i];
    if (!b.params.defined()) {
      whole[i] = d.zero2() ? at::empty({b.info.padded}, b.options) : b.flat;
      works[i] = d.group->all_gather_async(slice(i), whole[i]);
    }
    if (d.zero2() && i > 0) install(i - 1);
  }
  for (size_t i = d.zero2() && n > 0 ? n - 1 : 0; i < n; ++i) install(i);
}

}  // namespace shardplan
