#pragma once
// shardplan::TensorParallel: tensor parallelism inside one process, as the
// Python tensor_parallel libraries' TensorParallel(model, device_ids=["cpu",
// "cpu"]). The model is cloned once per device, each clone is sharded for its
// rank by parallelize() on the in-process `local` backend, and the replicas
// run concurrently on worker threads (one per rank, each owning its World),
// because a collective needs every rank at once.
//
//   auto tp = shardplan::TensorParallel(model, shardplan::load_plan("plans/mlp.yaml"), {"cpu", "cpu"});
//   torch::optim::SGD opt(tp->parameters(), 0.1);
//   auto y = tp->forward(x);             // rank 0's output: the plan must leave it whole
//   loss_fn(y).backward();               // runs every replica's backward
//   opt.step();
//   torch::save(tp, "model.pt");         // full tensors, loads into the plain model
//
// forward() returns one tensor of the caller's autograd graph; its backward
// hands the output gradient to every replica and returns rank 0's input
// gradients (the plan's mappings make them whole on every rank).
//
// A failure on one rank (in forward, backward or while sharding) aborts the
// others' communicators, so nobody waits for it, and is rethrown to the
// caller as shardplan::Error naming the rank. The collectives of that step
// are then incomplete on some ranks, so the wrapper refuses further work
// (an Error saying so); build a new one, e.g. from state_dict().
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/ordered_dict.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/parallelize.h"
#include "shardplan/plan.h"

namespace shardplan {

// Runs one replica on the caller's inputs. The default calls the model
// type's forward with every input as a tensor argument; give one for a
// forward that is overloaded, a template, or takes non-tensor arguments.
using ReplicaForward =
    std::function<at::Tensor(torch::nn::Module& replica, const std::vector<at::Tensor>& inputs)>;

namespace detail {

[[noreturn]] void forward_arity_error(size_t expected, size_t got);

template <class F>
struct forward_traits;
template <class C, class R, class... A>
struct forward_traits<R (C::*)(A...)> {
  static constexpr size_t arity = sizeof...(A);
};
template <class C, class R, class... A>
struct forward_traits<R (C::*)(A...) const> {
  static constexpr size_t arity = sizeof...(A);
};

template <class M, class F, size_t... I>
at::Tensor call_forward(M& m, F f, const std::vector<at::Tensor>& in, std::index_sequence<I...>) {
  return (m.*f)(in[I]...);
}

// Default arguments cannot travel through a member pointer, so every
// argument of M::forward must be given.
template <class M>
ReplicaForward forward_of() {
  return [](torch::nn::Module& m, const std::vector<at::Tensor>& in) -> at::Tensor {
    using F = decltype(&M::forward);
    constexpr size_t n = forward_traits<F>::arity;
    if (in.size() != n) forward_arity_error(n, in.size());
    return call_forward(dynamic_cast<M&>(m), &M::forward, in, std::make_index_sequence<n>{});
  };
}

// auto_plan for the wrapper: probed with `forward` on `example` (no probe
// when empty), at devices.size() ranks (shardplan/auto_plan.h).
Plan auto_plan_for(torch::nn::Module& model, size_t devices, const ReplicaForward& forward,
                   const std::vector<at::Tensor>& example);

}  // namespace detail

class TensorParallelImpl : public torch::nn::Module {
 public:
  // `model` must derive from torch::nn::Cloneable (it is cloned per device;
  // cloning re-runs its reset(), which draws from torch's global generator)
  // and be built from shardplan::nn layers where the plan shards. `devices`:
  // one "cpu" per rank; "cuda:*" is rejected (CPU-only build). Sharding is
  // collective and happens here; errors name the rank and the parameter.
  TensorParallelImpl(std::shared_ptr<torch::nn::Module> model, const Plan& plan,
                     const std::vector<std::string>& devices, ReplicaForward forward);
  template <class M, class = decltype(&M::forward)>
  TensorParallelImpl(const std::shared_ptr<M>& model, const Plan& plan, const std::vector<std::string>& devices)
      : TensorParallelImpl(std::shared_ptr<torch::nn::Module>(model), plan, devices, detail::forward_of<M>()) {}
  template <class M, class = decltype(&M::forward)>
  TensorParallelImpl(const torch::nn::ModuleHolder<M>& model, const Plan& plan,
                     const std::vector<std::string>& devices)
      : TensorParallelImpl(model.ptr(), plan, devices) {}
  // Without a plan: shardplan::auto_plan's, from a probe forward on
  // `example` (the model's inputs, any values; the output stays whole).
  // Without an example only self-contained layers (attention, LSTM) are
  // sharded: pairs need to see which layer feeds which.
  template <class M, class = decltype(&M::forward)>
  TensorParallelImpl(const std::shared_ptr<M>& model, const std::vector<std::string>& devices,
                     const std::vector<at::Tensor>& example = {})
      : TensorParallelImpl(std::shared_ptr<torch::nn::Module>(model),
                           detail::auto_plan_for(*model, devices.size(), detail::forward_of<M>(), example), devices,
                           detail::forward_of<M>()) {}
  ~TensorParallelImpl() override;

  // Every replica's forward at once; returns rank 0's output, which takes
  // part in the caller's autograd graph (unless grad mode is off). Each rank
  // must return an output of the same shape: the model's whole output.
  at::Tensor forward(const std::vector<at::Tensor>& inputs);
  template <class... Ts>
  at::Tensor forward(const at::Tensor& first, const Ts&... rest) {
    return forward(std::vector<at::Tensor>{first, rest...});
  }

  int world_size() const;
  const std::vector<std::string>& devices() const;
  // parallelize()'s report for `rank` (its table() shows the layouts).
  const ParallelReport& report(int rank) const;
  // The replica of `rank`, sharded (for inspection; do not train it directly).
  std::shared_ptr<torch::nn::Module> replica(int rank) const;

  // The unsharded model's parameters (gathered from the shards) then its
  // buffers (rank 0's), under their original names ("fc1.weight").
  torch::OrderedDict<std::string, at::Tensor> state_dict() const;
  // Loads full tensors under the original names into every replica's shard.
  // Throws naming a missing, unexpected or misshapen entry.
  void load_state_dict(const torch::OrderedDict<std::string, at::Tensor>& full);

  // torch::save(tp, path) writes what torch::save(model, path) would write
  // for the plain model with these values; torch::load(tp, path) reads that.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  // Also switches every replica (dropout, batch norm).
  void train(bool on = true) override;
  // Throw: replicas and their shard maps are made for the model's dtype and
  // device; convert the model before wrapping it.
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;
  void pretty_print(std::ostream& stream) const override;

  struct Runtime;  // threads, worlds, replicas and shard maps (src/parallel/tensor_parallel_internal.h)
  // shardplan/replicas.h: checks every rank's replica on its own thread.
  friend void check_replicas(TensorParallelImpl& tp);

 private:
  std::shared_ptr<Runtime> rt_;
};

// TORCH_MODULE's holder, plus constructors taking the device list as a braced
// list ({"cpu", "cpu"}), which the holder's forwarding constructor cannot.
class TensorParallel : public torch::nn::ModuleHolder<TensorParallelImpl> {
 public:
  using torch::nn::ModuleHolder<TensorParallelImpl>::ModuleHolder;
  TensorParallel(std::shared_ptr<torch::nn::Module> model, const Plan& plan, const std::vector<std::string>& devices,
                 ReplicaForward forward)
      : ModuleHolder(std::make_shared<TensorParallelImpl>(std::move(model), plan, devices, std::move(forward))) {}
  template <class M, class = decltype(&M::forward)>
  TensorParallel(const std::shared_ptr<M>& model, const Plan& plan, const std::vector<std::string>& devices)
      : ModuleHolder(std::make_shared<TensorParallelImpl>(model, plan, devices)) {}
  template <class M, class = decltype(&M::forward)>
  TensorParallel(const torch::nn::ModuleHolder<M>& model, const Plan& plan, const std::vector<std::string>& devices)
      : ModuleHolder(std::make_shared<TensorParallelImpl>(model, plan, devices)) {}
  // No plan: auto_plan's (see TensorParallelImpl), e.g.
  //   shardplan::TensorParallel tp(model, {"cpu", "cpu"}, {example_input});
  template <class M, class = decltype(&M::forward)>
  TensorParallel(const std::shared_ptr<M>& model, const std::vector<std::string>& devices,
                 const std::vector<at::Tensor>& example = {})
      : ModuleHolder(std::make_shared<TensorParallelImpl>(model, devices, example)) {}
  template <class M, class = decltype(&M::forward)>
  TensorParallel(const torch::nn::ModuleHolder<M>& model, const std::vector<std::string>& devices,
                 const std::vector<at::Tensor>& example = {})
      : ModuleHolder(std::make_shared<TensorParallelImpl>(model.ptr(), devices, example)) {}
  TensorParallel(std::shared_ptr<torch::nn::Module> model, const std::vector<std::string>& devices,
                 ReplicaForward forward, const std::vector<at::Tensor>& example)
      : ModuleHolder(std::make_shared<TensorParallelImpl>(
            model, detail::auto_plan_for(*model, devices.size(), forward, example), devices, forward)) {}
};

}  // namespace shardplan
