// TensorParallel's forward and backward: every rank runs the replica, and one
// autograd node in the caller's graph fans its backward out to the ranks.
#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/shape_text.h"
#include "shardplan/error.h"
#include "tensor_parallel_internal.h"

namespace shardplan {

namespace {

// What one forward leaves for its backward: per rank the inputs as that
// rank's graph saw them and its output. Owned by the autograd node (see
// keepalive), so it dies with the caller's graph.
struct Step {
  std::shared_ptr<TensorParallelImpl::Runtime> rt;
  std::vector<at::Tensor> caller_inputs;
  std::vector<std::vector<at::Tensor>> inputs;
  std::vector<at::Tensor> outputs;
};

// A tensor whose deleter owns `step`: saved for backward, it is released when the
// engine frees the node's buffers (after a backward without retain_graph)
// or when the graph goes away, so the replicas' graphs live exactly as long
// as the caller's.
at::Tensor keepalive(const std::shared_ptr<Step>& step) {
  return at::from_blob(
      step.get(), {1}, [step](void*) {}, at::TensorOptions().dtype(at::kByte));
}

struct ReplicasFunction : public torch::autograd::Function<ReplicasFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs,
                            const std::shared_ptr<Step>& step) {
    ctx->save_for_backward({keepalive(step)});
    // detach(): the caller's tensor gets this node as its history while the
    // replica's own graph root stays intact (they share the version counter,
    // so an in-place change of the result is still caught).
    return step->outputs[0].detach();
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    if (at::GradMode::is_enabled())
      throw Error("TensorParallel: backward with create_graph=true (double backward) is not supported");
    auto saved = ctx->get_saved_variables();
    Step& step = *static_cast<Step*>(saved[0].data_ptr());
    auto& rt = *step.rt;
    const at::Tensor grad = grad_outputs[0];
    {
      std::lock_guard<std::mutex> lock(rt.call_mu);
      rt.run([&](int r) {
        for (auto& x : step.inputs[r])
          if (x.defined() && x.requires_grad()) x.mutable_grad().reset();
        // Kept: a caller's retain_graph backs this node a second time.
        torch::autograd::backward({step.outputs[r]}, {grad}, /*retain_graph=*/true);
      });
    }
    // Rank 0's input gradients: a replicated input enters every rank through
    // the plan's mappings, whose backward makes its gradient whole.
    torch::autograd::variable_list out;
    for (size_t i = 0; i < step.caller_inputs.size(); ++i) {
      const auto& x = step.inputs[0][i];
      out.push_back(step.caller_inputs[i].requires_grad() && x.requires_grad() ? x.grad() : at::Tensor());
    }
    out.emplace_back();  // the anchor
    out.emplace_back();  // the step (not a tensor)
    return out;
  }
};

}  // namespace

at::Tensor TensorParallelImpl::forward(const std::vector<at::Tensor>& inputs) {
  auto& rt = *rt_;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].defined()) throw Error("TensorParallel: input " + std::to_string(i) + " is undefined");
  const bool grad = at::GradMode::is_enabled();
  auto step = std::make_shared<Step>();
  step->rt = rt_;
  step->caller_inputs = inputs;
  step->inputs.resize(rt.n);
  step->outputs.resize(rt.n);
  {
    std::lock_guard<std::mutex> lock(rt.call_mu);
    rt.run([&](int r) {
      at::AutoGradMode mode(grad);
      rt.sync_replicated(r);
      // Every rank reads the caller's tensors (replicas must not modify
      // their inputs in place); a rank's graph starts at its own leaves.
      auto& in = step->inputs[r];
      for (const auto& x : inputs) in.push_back(grad && x.requires_grad() ? x.detach().requires_grad_(true) : x);
      at::Tensor y = rt.forward_fn(*rt.replicas[r], in);
      if (!y.defined()) throw Error("the model's forward returned an undefined tensor");
      step->outputs[r] = y;
    });
  }
  const at::Tensor& y0 = step->outputs[0];
  for (int r = 1; r < rt.n; ++r)
    if (step->outputs[r].sizes() != y0.sizes())
      throw Error("TensorParallel: rank " + std::to_string(r) + "'s output has shape " +
                  shape_str(step->outputs[r].sizes()) + " but rank 0's has " + shape_str(y0.sizes()) +
                  "; the plan must leave the model's output whole on every rank (gather it)");
  if (!grad || !y0.requires_grad()) return y0;
  std::vector<at::Tensor> args = inputs;
  args.push_back(rt.anchor);
  return ReplicasFunction::apply(at::TensorList(args), step);
}

}  // namespace shardplan
