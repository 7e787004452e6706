#include "shardplan/nn/cross_entropy.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/enum.h>
#include <torch/nn/functional/loss.h>

#include <atomic>
#include <ostream>

#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "mappings/group_handle.h"

namespace shardplan {

namespace {

// A softmax over a vocabulary loses most of its digits in bfloat16 (8 bits
// of mantissa) or float16: Megatron computes it in float32 (logits.float()).
at::Tensor in_float32(const at::Tensor& logits) {
  const auto t = logits.scalar_type();
  return t == at::kBFloat16 || t == at::kHalf ? logits.to(at::kFloat) : logits;
}

}  // namespace

namespace nn {

CrossEntropyLossImpl::CrossEntropyLossImpl(const torch::nn::CrossEntropyLossOptions& options_) : options(options_) {
  reset();
}

// As torch's: the class weights are a buffer, so they follow .to() and appear
// in the state_dict under the same key.
void CrossEntropyLossImpl::reset() { weight = register_buffer("weight", options.weight()); }

void CrossEntropyLossImpl::pretty_print(std::ostream& stream) const {
  stream << "shardplan::nn::CrossEntropyLoss(";
  if (strategy_) stream << strategy_->describe();
  stream << ")";
}

at::Tensor CrossEntropyLossImpl::forward(const at::Tensor& input, const at::Tensor& target) {
  // The buffer, not options.weight(): .to() moves the buffer only.
  auto o = options;
  o.weight(weight);
  if (strategy_) return strategy_->forward(input, target, o);
  // As vocab_parallel_cross_entropy: half-precision logits in float32.
  return torch::nn::functional::cross_entropy(in_float32(input), target, o);
}

}  // namespace nn

namespace {

std::atomic<int64_t> g_widest{0};

void note_width(int64_t w) {
  int64_t cur = g_widest.load();
  while (w > cur && !g_widest.compare_exchange_weak(cur, w)) {
  }
}

// Records the class-dim extent of a tensor shaped like the logits.
const at::Tensor& noted(const at::Tensor& t, int64_t class_dim) {
  note_width(t.size(class_dim));
  return t;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Shape of the logits with the class dim squeezed to 1, for broadcasting a
// [C/n] weight slice against them.
std::vector<int64_t> class_view(const at::Tensor& x, int64_t class_dim) {
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[static_cast<size_t>(class_dim)] = x.size(class_dim);
  return shape;
}

struct VocabParallelCE : torch::autograd::Function<VocabParallelCE> {
  // weight: this rank's [C/n] slice, or empty for none (libtorch 1.13's
  // Function::apply rejects undefined tensor arguments). Every per-sample tensor
  // keeps the class dim with extent 1, so it broadcasts against the logits.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& target,
                            const at::Tensor& weight_arg, int64_t group, int64_t ignore_index, int64_t reduction,
                            double smoothing) {
    const at::Tensor weight = weight_arg.numel() ? weight_arg : at::Tensor();
    Communicator& g = group_at(group);
    const int64_t cd = x.dim() == 1 ? 0 : 1;
    const int64_t local_c = x.size(cd);
    const int64_t classes = local_c * g.size();
    const int64_t lo = local_c * g.rank();

    at::Tensor m = std::get<0>(x.max(cd, /*keepdim=*/true)).contiguous();
    g.all_reduce(m, ReduceOp::Max);
    at::Tensor shifted = noted(x - m, cd);
    at::Tensor e = noted(shifted.exp(), cd);
    at::Tensor sum = e.sum(cd, /*keepdim=*/true).contiguous();
    g.all_reduce(sum, ReduceOp::Sum);
    at::Tensor logp = noted(shifted - sum.log(), cd);  // this rank's slice of log_softmax
    at::Tensor p = noted(e / sum, cd);                 // and of softmax, for backward

    at::Tensor t = target.unsqueeze(cd);
    at::Tensor valid = t != ignore_index;
    if ((valid & ((t < 0) | (t >= classes))).any().item<bool>())
      throw Error("vocab_parallel_cross_entropy: a target is outside [0, " + std::to_string(classes) +
                  ") and is not ignore_index " + std::to_string(ignore_index));
    at::Tensor mine = valid & (t >= lo) & (t < lo + local_c);  // the target class lives on this rank
    at::Tensor idx = (t - lo).masked_fill(~mine, 0);
    // Only the owning rank contributes a sample's target log-probability.
    at::Tensor logp_t = logp.gather(cd, idx).masked_fill(~mine, 0).contiguous();
    g.all_reduce(logp_t, ReduceOp::Sum);

    at::Tensor w_local, w_t;  // w_t: weight of each sample's target class, 0 when ignored
    if (weight.defined()) {
      w_local = weight.to(x.scalar_type()).view(class_view(x, cd));
      note_width(w_local.numel());
      w_t = weight.to(x.scalar_type()).index_select(0, idx.flatten()).view(idx.sizes()).masked_fill(~mine, 0)
                .contiguous();
      g.all_reduce(w_t, ReduceOp::Sum);
    } else {
      w_t = valid.to(x.scalar_type());
    }

    at::Tensor per = -(w_t * logp_t);
    at::Tensor total_w;  // sum of all class weights, for the smoothing term's gradient
    if (smoothing > 0) {
      at::Tensor smooth = (w_local.defined() ? -(logp * w_local).sum(cd, true) : -logp.sum(cd, true)).contiguous();
      g.all_reduce(smooth, ReduceOp::Sum);
      smooth.masked_fill_(~valid, 0);
      per = (1 - smoothing) * per + smooth * (smoothing / static_cast<double>(classes));
      if (w_local.defined()) {
        total_w = w_local.sum().contiguous();
        g.all_reduce(total_w, ReduceOp::Sum);
      }
    }

    // torch normalises a mean by the summed target weights (the count of
    // non-ignored samples without weights), for both terms.
    at::Tensor denom = w_t.sum();
    at::Tensor out;
    if (reduction == at::Reduction::None)
      out = per.squeeze(cd);
    else if (reduction == at::Reduction::Sum)
      out = per.sum();
    else
      out = per.sum() / denom;

    ctx->saved_data["p"] = p;
    ctx->saved_data["idx"] = idx;
    ctx->saved_data["mine"] = mine;
    ctx->saved_data["valid"] = valid;
    ctx->saved_data["w_t"] = w_t;
    ctx->saved_data["w_local"] = w_local;
    ctx->saved_data["total_w"] = total_w;
    ctx->saved_data["denom"] = denom;
    ctx->saved_data["cd"] = cd;
    ctx->saved_data["classes"] = classes;
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["smoothing"] = smoothing;
    return out;
  }

  // d loss_i / d x_c = (1 - s) w_t (p_c - [c == t]) + (s / C) (W p_c - w_c),
  // W the sum of all class weights (C without weights), all local to the
  // rank's classes except the scalars.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor p = ctx->saved_data["p"].toTensor();
    const at::Tensor idx = ctx->saved_data["idx"].toTensor();
    const at::Tensor mine = ctx->saved_data["mine"].toTensor();
    const at::Tensor valid = ctx->saved_data["valid"].toTensor();
    const at::Tensor w_t = ctx->saved_data["w_t"].toTensor();
    const int64_t cd = ctx->saved_data["cd"].toInt();
    const int64_t classes = ctx->saved_data["classes"].toInt();
    const int64_t reduction = ctx->saved_data["reduction"].toInt();
    const double smoothing = ctx->saved_data["smoothing"].toDouble();

    at::Tensor go = grads[0];
    at::Tensor scale;  // d loss / d loss_i, shaped like a per-sample tensor
    if (reduction == at::Reduction::None)
      scale = go.unsqueeze(cd);
    else if (reduction == at::Reduction::Sum)
      scale = go;
    else
      scale = go / ctx->saved_data["denom"].toTensor();

    at::Tensor onehot = noted(at::zeros_like(p).scatter_(cd, idx, mine.to(p.scalar_type())), cd);
    at::Tensor grad = noted((p - onehot) * w_t, cd);
    if (smoothing > 0) {
      grad.mul_(1 - smoothing);
      const double s = smoothing / static_cast<double>(classes);
      at::Tensor w_local = ctx->saved_data["w_local"].toTensor();
      if (w_local.defined())
        grad.add_((p * ctx->saved_data["total_w"].toTensor() - w_local) * s);
      else
        grad.add_((p * static_cast<double>(classes) - 1) * s);
      grad.mul_(valid.to(grad.scalar_type()));
    }
    grad.mul_(scale);
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits_shard, const at::Tensor& target, Communicator& group,
                                        const torch::nn::CrossEntropyLossOptions& options) {
  const at::Tensor x = in_float32(logits_shard);
  if (x.dim() < 1) throw Error("vocab_parallel_cross_entropy: logits need a class dim, got a scalar");
  if (!x.is_floating_point()) throw Error("vocab_parallel_cross_entropy: logits must be floating point");
  if (target.is_floating_point())
    throw Error("vocab_parallel_cross_entropy: class-probability targets are not supported, only class indices");
  const int64_t cd = x.dim() == 1 ? 0 : 1;
  auto expected = x.sizes().vec();
  expected.erase(expected.begin() + cd);
  if (target.sizes().vec() != expected)
    throw Error("vocab_parallel_cross_entropy: target shape " + c10::str(target.sizes()) +
                " does not match logits shard " + c10::str(x.sizes()) + " without its class dim " +
                std::to_string(cd));
  const int64_t local_c = x.size(cd), n = group.size();
  at::Tensor w = options.weight();
  if (w.defined()) {
    if (w.dim() == 1 && w.size(0) == local_c * n)
      w = w.narrow(0, local_c * group.rank(), local_c);  // a view: the full vector is the caller's
    else if (!(w.dim() == 1 && w.size(0) == local_c))
      throw Error("vocab_parallel_cross_entropy: weight of shape " + c10::str(w.sizes()) + " is neither the full [" +
                  std::to_string(local_c * n) + "] class weights nor this rank's [" + std::to_string(local_c) +
                  "] slice");
  }
  const int64_t reduction = torch::enumtype::reduction_get_enum(options.reduction());
  if (!w.defined()) w = at::empty({0}, x.options());
  return VocabParallelCE::apply(x, target.to(at::kLong), w, group_handle(group),
                                options.ignore_index(), reduction, options.label_smoothing());
}

namespace testing {
int64_t vocab_parallel_widest() { return g_widest.load(); }
void reset_vocab_parallel_widest() { g_widest.store(0); }
}  // namespace testing

}  // namespace shardplan
