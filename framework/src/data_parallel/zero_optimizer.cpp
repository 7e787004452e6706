#include "shardplan/zero_optimizer.h"

#include <torch/torch.h>

#include "data_parallel_impl.h"
#include "shardplan/error.h"

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
    throw Error("ZeroOptimizer needs a plan with data_parallel: {zero: true}; this plan reduces whole gradients, "
                "so use a plain torch optimizer");
  if (d.zero_attached) throw Error("ZeroOptimizer: this DataParallel already has one");
  // This rank's slice of each bucket's parameters, flattened in bucket order.
  std::vector<at::Tensor> shards;
  for (auto& b : d.buckets) {
    std::vector<at::Tensor> parts;
    for (size_t i : b.entries) parts.push_back(d.entries[i].param.detach().reshape(-1));
    at::Tensor flat = at::cat(parts);
    if (b.info.padded > b.info.numel) flat = at::cat({flat, at::zeros({b.info.padded - b.info.numel}, flat.options())});
    const int64_t n = b.info.padded / d.size;
    shards.push_back(flat.narrow(0, d.rank * n, n).clone().requires_grad_(true));
  }
  auto inner = make(shards);
  if (!inner) throw Error("ZeroOptimizer: the factory returned no optimizer");
  if (elementwise_name(*inner).empty())
    throw Error("ZeroOptimizer supports element-wise optimizers only (Adam, AdamW, SGD, RMSprop, Adagrad): an "
                "update that reads the whole parameter cannot run on a 1/D slice");
  // Only now, with nothing left to refuse, does anything change.
  inner_ = std::move(inner);
  shards_ = std::move(shards);
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
    out.push_back(std::move(b));
  }
  return out;
}

void ZeroOptimizer::zero_grad() {
  DataParallel::Impl& d = *dp_.impl_;
  d.zero_unconsumed = false;
  for (auto& e : d.entries)
    if (e.param.grad().defined()) e.param.mutable_grad() = at::Tensor();
  for (auto& s : shards_) s.mutable_grad() = at::Tensor();
}

void ZeroOptimizer::step() {
  DataParallel::Impl& d = *dp_.impl_;
  dp_.finish();  // nothing to do when backward's end averaged already
  d.zero_unconsumed = false;
  for (size_t i = 0; i < d.buckets.size(); ++i) shards_[i].mutable_grad() = d.buckets[i].shard.clone();
  {
    torch::NoGradGuard no_grad;
    inner_->step();
  }
  std::vector<std::unique_ptr<Work>> works;
  for (size_t i = 0; i < d.buckets.size(); ++i) works.push_back(d.group->all_gather_async(shards_[i], d.buckets[i].flat));
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < d.buckets.size(); ++i) {
    if (works[i]) works[i]->wait();
    auto& b = d.buckets[i];
    for (size_t k : b.entries) {
      auto& e = d.entries[k];
      e.param.copy_(b.flat.narrow(0, e.offset, e.param.numel()).view(e.param.sizes()));
    }
  }
}

}  // namespace shardplan
