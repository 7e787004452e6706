#include "shardplan/optimizer.h"

#include <torch/torch.h>

#include "data_parallel/data_parallel_impl.h"
#include "shardplan/error.h"

namespace shardplan {

Optimizer::Optimizer(DataParallel& dp, const Factory& make) : dp_(dp) {
  if (dp.zero()) {
    zero_ = std::make_unique<ZeroOptimizer>(dp, make);
    return;
  }
  std::vector<at::Tensor> params;
  for (const auto& [name, p] : dp.impl_->unique) params.push_back(p);
  plain_ = make(params);
  if (!plain_) throw Error("shardplan::Optimizer: the factory returned no optimizer");
}

Optimizer::~Optimizer() = default;

void Optimizer::step() {
  if (zero_) {
    zero_->step();
    return;
  }
  dp_.finish();
  plain_->step();
  // The averages are used up: a rank whose next backward reaches no averaged
  // parameter (so no hook tells it a backward ran) still joins its peers'
  // round in the next step().
  dp_.impl_->finished = false;
}

void Optimizer::zero_grad() {
  if (zero_)
    zero_->zero_grad();
  else
    plain_->zero_grad();
}

torch::optim::Optimizer& Optimizer::inner() { return zero_ ? zero_->inner() : *plain_; }

ZeroOptimizer* Optimizer::zero() const { return zero_.get(); }

int64_t Optimizer::state_bytes() const { return zero_ ? zero_->state_bytes() : optimizer_state_bytes(*plain_); }

CheckpointOptions Optimizer::checkpoint_options() const {
  CheckpointOptions o;
  if (zero_)
    o.zero = zero_.get();
  else
    o.optimizer = plain_.get();
  return o;
}

}  // namespace shardplan
