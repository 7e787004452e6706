#include "shardplan/zero_optimizer.h"

#include <torch/torch.h>

#include "data_parallel_impl.h"
#include "shardplan/error.h"

#include <algorithm>
#include <set>
#include <string>

namespace shardplan {
namespace {

std::set<std::string> outside_buckets(const DataParallel::Impl& d) {
  std::set<std::string> out(d.ignored.begin(), d.ignored.end());
  out.insert(d.split.begin(), d.split.end());
  return out;
}

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
  std::vector<at::Tensor> shards, params;
  std::vector<std::vector<Segment>> segments;
  for (auto& b : d.buckets) {
    const int64_t n = b.info.padded / d.size, lo = d.rank * n;
    if (b.params.defined()) {
      // ZeRO-3: the unit's slice is the parameters' only copy; step it in place.
      shards.push_back(b.params);
    } else {
      std::vector<at::Tensor> parts;
      for (size_t i : b.entries) parts.push_back(d.entries[i].param.detach().reshape(-1));
      // With master weights the buckets have the masters' dtype.
      at::Tensor flat = at::cat(parts).to(b.flat.scalar_type());
      if (b.info.padded > b.info.numel)
        flat = at::cat({flat, at::zeros({b.info.padded - b.info.numel}, flat.options())});
      shards.push_back(flat.narrow(0, lo, n).clone());
    }
    segments.emplace_back();
    for (size_t m = 0; m < b.entries.size(); ++m) {
      const auto& e = d.entries[b.entries[m]];
      const int64_t begin = std::max(e.offset, lo), end = std::min(e.offset + e.numel, lo + n);
      if (begin >= end) continue;
      // A leaf of its own (the slice requires no gradient) whose in-place
      // updates land in the slice.
      at::Tensor view = shards.back().narrow(0, begin - lo, end - begin);
      view.requires_grad_(true);
      segments.back().push_back(Segment{view, m, begin - lo});
      params.push_back(view);
    }
  }
  // Parameters outside the buckets (ignored, or split over the batch axis)
  // are not averaged: the optimizer steps them whole with this rank's own
  // gradient, as a plain optimizer beside DataParallel does.
  std::vector<at::Tensor> locals;
  const std::set<std::string> outside = outside_buckets(d);
  for (const auto& [name, p] : d.unique) {
    if (!outside.count(name) || !p.requires_grad()) continue;
    locals.push_back(p);
    params.push_back(p);
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
  locals_ = std::move(locals);
  d.zero_attached = true;
}

ZeroOptimizer::~ZeroOptimizer() { dp_.impl_->zero_attached = false; }

torch::optim::Optimizer& ZeroOptimizer::inner() { return *inner_; }

int64_t ZeroOptimizer::state_bytes() const { return optimizer_state_bytes(*inner_); }

std::vector<ZeroOptimizer::Bucket> ZeroOptimizer::layout() const {
  const DataParallel::Impl& d = *dp_.impl_;
  std::vector<Bucket> out;
  for (size_t i = 0; i < d.buckets.size(); ++i) {
    Bucket b;
    b.slice = shards_[i];
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
  for (auto& p : locals_) p.mutable_grad() = at::Tensor();
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
  for (auto& p : locals_) out.push_back(p.grad());
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
  // ZeRO-3's units are gathered by their next forward, from the slices just
  // stepped; anything still whole would be stale.
  {
    std::lock_guard<std::mutex> lock(d.mu);
    d.release_all_units();
  }
  std::vector<std::unique_ptr<Work>> works;
  for (size_t i = 0; i < d.buckets.size(); ++i)
    works.push_back(d.buckets[i].params.defined() ? nullptr
                                                  : d.group->all_gather_async(shards_[i], d.buckets[i].flat));
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < d.buckets.size(); ++i) {
    if (works[i]) works[i]->wait();
    auto& b = d.buckets[i];
    if (b.params.defined()) continue;
    for (size_t k : b.entries) {
      auto& e = d.entries[k];
      e.param.copy_(b.flat.narrow(0, e.offset, e.numel).view(e.sizes));
    }
  }
}

}  // namespace shardplan
