#include "shardplan/optimizer.h"

#include <torch/torch.h>

#include <map>

#include "data_parallel/data_parallel_impl.h"
#include "shardplan/error.h"

namespace shardplan {

// Master weights for a plain (not ZeRO) optimizer: one copy per unique
// parameter, in the masters' dtype. A parameter in a bucket gets the
// bucket's main grad; one outside (ignored, split over the batch axis) its
// own .grad, cast.
struct Optimizer::Masters {
  std::vector<at::Tensor> params, copies;
  std::vector<long> entry;  // DataParallel entry index, or -1
};

namespace {

std::string param_dtype_problem(const std::vector<std::pair<std::string, at::Tensor>>& params,
                                const MixedPrecision& mixed) {
  if (mixed.master_dtype && !at::isFloatingType(*mixed.master_dtype))
    return std::string("shardplan::Optimizer: MixedPrecision::master_dtype must be a floating dtype, got ") +
           c10::toString(*mixed.master_dtype);
  if (!mixed.loss_scaler)
    for (const auto& [name, p] : params)
      if (p.requires_grad() && p.scalar_type() == at::kHalf)
        return "shardplan::Optimizer: parameter '" + name +
               "' is float16, whose small gradients underflow to zero without loss scaling: set "
               "MixedPrecision::loss_scaler (LossScalerOptions{}), or train in bfloat16";
  return "";
}

}  // namespace

Optimizer::Optimizer(DataParallel& dp, const Factory& make) : dp_(dp) { init(make, MixedPrecision{}); }

Optimizer::Optimizer(DataParallel& dp, const Factory& make, const MixedPrecision& mixed) : dp_(dp) {
  init(make, mixed);
}

void Optimizer::init(const Factory& make, const MixedPrecision& mixed) {
  DataParallel::Impl& d = *dp_.impl_;
  const std::string problem = param_dtype_problem(d.unique, mixed);
  if (!problem.empty()) throw Error(problem);
  std::unique_ptr<LossScaler> scaler;
  if (mixed.loss_scaler) scaler = std::make_unique<LossScaler>(*mixed.loss_scaler);
  bool masters = false;
  std::vector<std::pair<std::string, at::Tensor>> trainable;
  for (const auto& [name, p] : d.unique)
    if (p.requires_grad()) {
      trainable.emplace_back(name, p);
      masters = masters || (mixed.master_dtype && p.scalar_type() != *mixed.master_dtype);
    }
  // ZeRO's masters are its slices: a parameter outside the buckets has none.
  if (masters && dp_.zero())
    for (const auto* list : {&d.ignored, &d.split})
      for (const std::string& name : *list)
        for (const auto& t : trainable)
          if (t.first == name)
            throw Error("shardplan::Optimizer: master weights (MixedPrecision::master_dtype) with data_parallel.zero "
                        "do not cover parameter '" + name + "' (outside the buckets: data_parallel.ignore or split "
                        "over the batch axis); drop the master dtype or that parameter's ignore entry");
  if (masters) d.use_main_grads(*mixed.master_dtype, trainable);
  scaler_ = std::move(scaler);
  if (dp_.zero()) {
    zero_ = std::make_unique<ZeroOptimizer>(dp_, make);
    return;
  }
  std::vector<at::Tensor> params;
  if (masters) {
    masters_ = std::make_unique<Masters>();
    std::map<const void*, long> entry_of;
    for (size_t i = 0; i < d.entries.size(); ++i) entry_of[d.entries[i].param.unsafeGetTensorImpl()] = static_cast<long>(i);
    for (const auto& [name, p] : d.unique) {
      at::Tensor copy = p.detach().to(*mixed.master_dtype).clone().requires_grad_(p.requires_grad());
      masters_->params.push_back(p);
      masters_->copies.push_back(copy);
      const auto it = entry_of.find(p.unsafeGetTensorImpl());
      masters_->entry.push_back(it == entry_of.end() ? -1 : it->second);
      params.push_back(copy);
    }
  } else {
    for (const auto& [name, p] : d.unique) params.push_back(p);
  }
  plain_ = make(params);
  if (!plain_) throw Error("shardplan::Optimizer: the factory returned no optimizer");
}

Optimizer::~Optimizer() = default;

// The averaging completed, and the masters' gradients the buckets' sums.
// The averaging completed, and the masters' gradients the buckets' sums.
// Idempotent until step() (unscale_ and clipping scale them in place
// between calls): a master gradient already set is left as it is.
void Optimizer::complete_grads() {
  if (zero_) {
    zero_->slice_grads();
    return;
  }
  dp_.finish();
  if (!masters_) return;
  DataParallel::Impl& d = *dp_.impl_;
  for (size_t k = 0; k < masters_->copies.size(); ++k) {
    at::Tensor& grad = masters_->copies[k].mutable_grad();
    if (grad.defined()) continue;
    const long i = masters_->entry[k];
    if (i >= 0) {
      // A parameter no rank used since the last step keeps none.
      if (static_cast<size_t>(i) < d.zero_used.size() && d.zero_used[i]) grad = d.main_grad(i);
    } else if (const at::Tensor& g = masters_->params[k].grad(); g.defined()) {
      grad = g.detach().to(masters_->copies[k].scalar_type());
    }
  }
}

std::vector<at::Tensor> Optimizer::step_grads() {
  complete_grads();
  if (zero_) return zero_->slice_grads();
  std::vector<at::Tensor> out;
  for (const auto& t : step_tensors()) out.push_back(t.grad());
  return out;
}

// Not the inner optimizer's param_groups(): a factory may group its tensors
// in any order (e.g. weight decay apart).
std::vector<at::Tensor> Optimizer::step_tensors() {
  std::vector<at::Tensor> out;
  if (zero_) {
    for (const auto& b : zero_->layout())
      for (const auto& s : b.segments) out.push_back(s.tensor);
    out.insert(out.end(), zero_->locals().begin(), zero_->locals().end());
  } else if (masters_) {
    out = masters_->copies;
  } else {
    for (const auto& [name, p] : dp_.impl_->unique) out.push_back(p);
  }
  return out;
}

void Optimizer::unscale_() {
  if (!scaler_ || unscaled_) return;
  const std::vector<at::Tensor> grads = step_grads();
  const double inv = 1.0 / scaler_->scale();
  bool inf = false;
  at::NoGradGuard no_grad;
  at::Device device = at::kCPU;
  for (const auto& g : grads) {
    if (!g.defined()) continue;
    device = g.device();
    g.mul_(inv);
    inf = inf || !at::isfinite(g).all().item<bool>();
  }
  // One rank's inf must stop every rank: a tensor-parallel shard's overflow
  // is the whole model's, and replicas must stay identical.
  at::Tensor flag = at::full({1}, inf ? 1.0f : 0.0f, at::TensorOptions().dtype(at::kFloat).device(device));
  const DataParallel::Impl& d = *dp_.impl_;
  if (d.world && d.world->size() > 1 && d.mesh.size() == d.world->size()) d.world->all_reduce(flag, ReduceOp::Max);
  found_inf_ = flag.item<float>() > 0;
  unscaled_ = true;
}

void Optimizer::step() {
  DataParallel::Impl& d = *dp_.impl_;
  unscale_();
  complete_grads();
  skipped_ = scaler_ && found_inf_;
  if (zero_) {
    if (skipped_)
      zero_->skip_step();
    else
      zero_->step();
  } else if (!skipped_) {
    plain_->step();
    if (masters_) {
      at::NoGradGuard no_grad;
      for (size_t k = 0; k < masters_->copies.size(); ++k) masters_->params[k].copy_(masters_->copies[k]);
    }
  }
  if (scaler_) scaler_->update(found_inf_);
  unscaled_ = found_inf_ = false;
  // The averages are used up: a rank whose next backward reaches no averaged
  // parameter (so no hook tells it a backward ran) still joins its peers'
  // round in the next step(). Main grads: the next backward starts afresh.
  d.finished = false;
  if (d.main() && !zero_) {
    d.main_unconsumed = false;
    std::fill(d.zero_used.begin(), d.zero_used.end(), false);
    if (masters_)
      for (auto& m : masters_->copies) m.mutable_grad() = at::Tensor();
  }
}

void Optimizer::zero_grad() {
  unscaled_ = found_inf_ = false;
  if (zero_) {
    zero_->zero_grad();
    return;
  }
  if (!masters_) {
    plain_->zero_grad();
    return;
  }
  dp_.impl_->discard_main_grads();
  for (size_t k = 0; k < masters_->copies.size(); ++k) {
    masters_->copies[k].mutable_grad() = at::Tensor();
    if (masters_->params[k].grad().defined()) masters_->params[k].mutable_grad() = at::Tensor();
  }
}

at::Tensor Optimizer::scale_loss(const at::Tensor& loss) const { return scaler_ ? scaler_->scale_loss(loss) : loss; }

bool Optimizer::masters() const { return masters_ != nullptr || (zero_ && zero_->masters()); }
LossScaler* Optimizer::loss_scaler() { return scaler_.get(); }
bool Optimizer::last_step_skipped() const { return skipped_; }

void Optimizer::load_attributes(const std::map<std::string, std::string>& attributes) {
  if (scaler_) scaler_->load_state(attributes);
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
  if (masters_)
    for (size_t k = 0; k < masters_->copies.size(); ++k) o.masters.emplace_back(masters_->params[k], masters_->copies[k]);
  if (scaler_) o.attributes = scaler_->state();
  return o;
}

}  // namespace shardplan
