// Pipeline::step: this rank's action list, run.
#include <algorithm>
#include <chrono>
#include <optional>

#include "data_parallel/data_parallel_impl.h"
#include "pipeline_internal.h"
#include "shardplan/error.h"
#include "shardplan/random.h"

namespace shardplan {

namespace {

// One tag per kind, so each channel's messages arrive in the order sent,
// which is the order the schedule receives them (simulate_schedule checks).
constexpr int kActivationTag = 0, kGradientTag = 1;
// An activation's header: dims, dtype, then the sizes; fixed length, so the
// receiver knows what to post before it knows the shape.
constexpr int64_t kMaxDims = 8, kHeader = kMaxDims + 2;

at::Tensor micro_slice(const at::Tensor& t, int micro, int micro_batches) {
  const int64_t n = t.size(0) / micro_batches;
  return t.narrow(0, micro * n, n);
}

// Adds the scope's wall time to a PipelineStats field.
class Timed {
 public:
  explicit Timed(double& into) : into_(into), t0_(std::chrono::steady_clock::now()) {}
  ~Timed() { into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  double& into_;
  std::chrono::steady_clock::time_point t0_;
};

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

}  // namespace

// Megatron seeds each pipeline rank's streams with seed + 100 x its stage:
// with one seed for all, stage 1's first block would draw stage 0's first
// block's dropout masks. Ranks of one stage (model, data) offset alike.
std::shared_ptr<RngTracker> Pipeline::stage_rng() {
  RngTracker* base = current_rng_tracker();
  if (!base || stage_ == 0) return nullptr;
  if (base != stage_rng_base_) {
    stage_rng_ = std::make_shared<RngTracker>(base->seed() + 100 * static_cast<uint64_t>(stage_), base->mesh(),
                                              base->rank());
    stage_rng_->owner = base->owner;
    stage_rng_base_ = base;
  }
  return stage_rng_;
}

double Pipeline::step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss) {
  const std::shared_ptr<RngTracker> rng = stage_rng();
  std::optional<RngTrackerScope> stage_streams;
  if (rng) stage_streams.emplace(rng);
  if (!dp_) return run_schedule(input, target, loss);
  // Under the caller's NoSync (gradient accumulation over several steps)
  // the reduction waits for its first step outside it.
  const bool accumulating = dp_->impl().no_sync > 0;
  double local = 0;
  {
    // One reduction per step, after the last micro-batch's backward, not one per backward.
    DataParallel::NoSync accumulate(*dp_);
    local = run_schedule(dp_->local_batch(input), dp_->local_batch(target), loss);
  }
  if (!accumulating) dp_->finish();
  return dp_->average(local);
}

double Pipeline::run_schedule(const at::Tensor& input, const at::Tensor& target, const LossFn& loss) {
  for (const at::Tensor* t : {&input, &target})
    if (t->dim() == 0 || t->size(0) % micro_ != 0)
      throw Error("pipeline: a batch of " + (t->dim() ? std::to_string(t->size(0)) : std::string("no dims")) +
                  " along dim 0 does not divide into " + std::to_string(micro_) + " micro-batches");
  stats_ = PipelineStats();
  in_flight_ = 0;
  live_bytes_ = 0;
  Timed whole(stats_.step_s);
  std::vector<Slot> slots(static_cast<size_t>(micro_ * virtual_));
  loss_sum_ = at::zeros({1}, at::kDouble);
  // What earlier steps accumulated into the tied copies (already summed):
  // only this step's part goes over the pipe group.
  std::vector<at::Tensor> before;
  for (const auto& [t, kept] : tied_) before.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
  for (const PipelineAction& a : schedule_[stage_]) {
    Slot& slot = slots[a.micro * virtual_ + a.chunk];
    switch (a.op) {
      case PipelineOp::recv_activation: slot.input = recv(a.peer, kActivationTag, a.chunk, a.micro == 0); break;
      case PipelineOp::forward: forward(a, slot, micro_slice(input, a.micro, micro_)); break;
      case PipelineOp::send_activation: send(slot.output.detach(), a.peer, kActivationTag, a.micro == 0); break;
      case PipelineOp::recv_gradient: slot.grad = recv_like(slot.output, a.peer); break;
      case PipelineOp::backward: backward(a, slot, micro_slice(target, a.micro, micro_), loss); break;
      case PipelineOp::send_gradient: send_gradient(slot, a.peer); break;
    }
  }
  {
    Timed waiting(stats_.wait_s);
    for (auto& w : pending_) w->wait();
  }
  pending_.clear();
  sum_tied_gradients(before);
  // The last rank of the group holds the last model stage, whatever v is.
  group_->broadcast(loss_sum_, stages_ - 1);
  return loss_sum_.item<double>();
}

// Every rank of the pipe group takes part, zeros where it keeps no copy.
// In place: .grad may be a DataParallel bucket's view.
void Pipeline::sum_tied_gradients(const std::vector<at::Tensor>& before) {
  for (size_t i = 0; i < tied_.size(); ++i) {
    auto& [t, kept] = tied_[i];
    const bool had = t.grad().defined();
    at::Tensor g = had ? t.grad() : at::zeros_like(t);
    if (before[i].defined()) g.sub_(before[i]);
    group_->all_reduce(g);
    if (before[i].defined()) g.add_(before[i]);
    if (kept && !had) t.mutable_grad() = g;
  }
}

void Pipeline::forward(const PipelineAction& a, Slot& slot, const at::Tensor& micro_input) {
  at::Tensor x = model_stage(a.chunk) == 0 ? micro_input : slot.input;
  {
    Timed computing(stats_.forward_s);
    for (size_t i = chunks_[a.chunk].first; i < chunks_[a.chunk].second; ++i) x = pieces_.forward_piece(i, x);
  }
  slot.output = x;
  live_bytes_ += bytes_of(slot.input) + bytes_of(slot.output);
  stats_.peak_in_flight = std::max(stats_.peak_in_flight, ++in_flight_);
  stats_.peak_activation_bytes = std::max(stats_.peak_activation_bytes, live_bytes_);
}

void Pipeline::backward(const PipelineAction& a, Slot& slot, const at::Tensor& micro_target, const LossFn& loss) {
  // Released here: the input's gradient goes out right after.
  live_bytes_ -= bytes_of(slot.input) + bytes_of(slot.output);
  --in_flight_;
  Timed computing(stats_.backward_s);
  if (last_model_stage(a.chunk)) {
    // Each micro-batch's mean loss over m: the gradients add up to the
    // global batch's mean loss's.
    const at::Tensor l = loss(slot.output, micro_target) / micro_;
    loss_sum_ += l.detach().to(at::kDouble).reshape({1});
    l.backward();
  } else if (slot.output.requires_grad()) {  // not so for a first stage without parameters
    slot.output.backward(slot.grad);
  }
  slot.output = at::Tensor();
  slot.grad = at::Tensor();
}

void Pipeline::send_gradient(Slot& slot, int peer) {
  at::Tensor g = slot.input.grad();
  // An input the chunk never used still owes its sender a gradient.
  if (!g.defined()) g = at::zeros_like(slot.input);
  send(g, peer, kGradientTag, false);
  slot.input = at::Tensor();
}

void Pipeline::send(const at::Tensor& t, int peer, int tag, bool header) {
  Timed waiting(stats_.wait_s);
  stats_.bytes_sent += bytes_of(t);
  if (header) {
    if (t.dim() > kMaxDims)
      throw Error("pipeline: an activation of " + std::to_string(t.dim()) + " dims; at most " +
                  std::to_string(kMaxDims) + " go between stages");
    at::Tensor h = at::zeros({kHeader}, at::kLong);
    h[0] = t.dim();
    h[1] = static_cast<int64_t>(t.scalar_type());
    for (int64_t d = 0; d < t.dim(); ++d) h[2 + d] = t.size(d);
    pending_.push_back(group_->send_async(h, peer, tag));
  }
  pending_.push_back(group_->send_async(t.contiguous(), peer, tag));
}

at::Tensor Pipeline::recv(int peer, int tag, int chunk, bool header) {
  Timed waiting(stats_.wait_s);
  auto& [shape, dtype] = shapes_[chunk];
  if (header) {
    at::Tensor h = at::zeros({kHeader}, at::kLong);
    group_->recv(h, peer, tag);
    const int64_t dims = h[0].item<int64_t>();
    if (dims < 0 || dims > kMaxDims) throw Error("pipeline: a malformed activation header from stage " + std::to_string(peer));
    shape.assign(h.data_ptr<int64_t>() + 2, h.data_ptr<int64_t>() + 2 + dims);
    dtype = static_cast<at::ScalarType>(h[1].item<int64_t>());
  }
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
  group_->recv(t, peer, tag);
  stats_.bytes_received += bytes_of(t);
  // Activations that carry gradients become leaves whose .grad goes back.
  if (c10::isFloatingType(dtype) || c10::isComplexType(dtype)) t.requires_grad_(true);
  return t;
}

at::Tensor Pipeline::recv_like(const at::Tensor& output, int peer) {
  Timed waiting(stats_.wait_s);
  at::Tensor g = at::empty(output.sizes(), output.options().requires_grad(false));
  group_->recv(g, peer, kGradientTag);
  stats_.bytes_received += bytes_of(g);
  return g;
}

}  // namespace shardplan
