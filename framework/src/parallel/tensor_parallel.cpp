// TensorParallel's construction: one replica per rank, sharded by its plan,
// the shard maps state_dict() needs, and the parameters an optimizer sees.
// (Rank threads: tensor_parallel_runtime.cpp; forward and backward:
// tensor_parallel_autograd.cpp; state_dict: tensor_parallel_state.cpp.)
#include "shardplan/tensor_parallel.h"

#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <exception>
#include <mutex>
#include <unordered_set>

#include "shardplan/error.h"
#include "shardplan/world.h"
#include "tensor_parallel_internal.h"

namespace shardplan {

namespace detail {
void forward_arity_error(size_t expected, size_t got) {
  throw Error("TensorParallel: the model's forward takes " + std::to_string(expected) + " tensor argument(s), got " +
              std::to_string(got) + " (pass every argument, or give TensorParallel a ReplicaForward)");
}
}  // namespace detail

namespace {

// The first line of an exception's message (c10::Error appends a backtrace).
std::string message_of(const std::exception& e) {
  const auto* c10e = dynamic_cast<const c10::Error*>(&e);
  std::string m = c10e ? c10e->what_without_backtrace() : e.what();
  auto nl = m.find('\n');
  return nl == std::string::npos ? m : m.substr(0, nl);
}

void check_devices(const std::vector<std::string>& devices) {
  if (devices.empty()) throw Error("TensorParallel: no devices given; pass one \"cpu\" per rank");
  for (const auto& d : devices) {
    if (d == "cpu") continue;
    if (d.rfind("cuda", 0) == 0 || d.rfind("gpu", 0) == 0)
      throw Error("TensorParallel: device '" + d +
                  "' is not supported: replicas run on the CPU in this build (libtorch without CUDA); pass \"cpu\" "
                  "for each rank");
    throw Error("TensorParallel: device '" + d + "' is not a device; pass \"cpu\" for each rank");
  }
}

std::shared_ptr<torch::nn::Module> clone_of(const torch::nn::Module& model) {
  try {
    return model.clone();
  } catch (const std::exception& e) {
    throw Error("TensorParallel: the model (" + model.name() +
                ") must be cloneable, one replica per device: derive it from torch::nn::Cloneable<" + model.name() +
                "> (" + message_of(e) + ")");
  }
}

}  // namespace

namespace tp_detail {

at::Tensor find_named(const torch::OrderedDict<std::string, at::Tensor>& dict, const std::string& name,
                      const char* what, int rank) {
  const at::Tensor* t = dict.find(name);
  if (!t)
    throw Error("TensorParallel: rank " + std::to_string(rank) + "'s replica has no " + what + " '" + name +
                "' after parallelize");
  return *t;
}

}  // namespace tp_detail

namespace {

// The path's modules below `root`, creating empty ones on the way.
torch::nn::Module& mirror_at(torch::nn::Module& root, const std::string& path, std::string& leaf) {
  torch::nn::Module* m = &root;
  size_t start = 0;
  for (size_t dot = path.find('.'); dot != std::string::npos; start = dot + 1, dot = path.find('.', start)) {
    const std::string part = path.substr(start, dot - start);
    auto children = m->named_children();
    if (auto* c = children.find(part)) {
      m = c->get();
    } else {
      m = m->register_module(part, std::make_shared<torch::nn::Module>("shardplan::TensorParallel::Shards")).get();
    }
  }
  leaf = path.substr(start);
  return *m;
}

}  // namespace

using tp_detail::find_named;
using tp_detail::ParamSlot;
using tp_detail::Workers;

// ---------------------------------------------------------------- construction

TensorParallelImpl::TensorParallelImpl(std::shared_ptr<torch::nn::Module> model, const Plan& plan,
                                       const std::vector<std::string>& devices, ReplicaForward forward)
    : torch::nn::Module("shardplan::TensorParallel") {
  if (!model) throw Error("TensorParallel: the model is null");
  if (!forward) throw Error("TensorParallel: no forward function given");
  check_devices(devices);
  auto rt = std::make_shared<Runtime>();
  rt->n = static_cast<int>(devices.size());
  rt->devices = devices;
  rt->forward_fn = std::move(forward);
  rt->prototype = model;
  const int n = rt->n;
  // Clones here, not on the workers: cloning re-runs reset(), and ranks that
  // are threads would race on torch's global generator.
  for (int r = 0; r < n; ++r) rt->replicas.push_back(clone_of(*model));
  rt->reports.resize(n);
  rt->worlds.resize(n);
  rt->workers = std::make_unique<Workers>(n);

  static std::atomic<uint64_t> counter{0};
  const std::string id = "tensor-parallel-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  rt->run([&](int r) {
    WorldOptions o;
    o.backend = "local";
    o.rank = r;
    o.world_size = n;
    o.local_rank = r;
    o.local_world_size = n;
    o.backend_options = {"local_id=" + id};
    auto w = init_world(o);
    {
      std::lock_guard<std::mutex> lock(rt->worlds_mu);
      rt->worlds[r] = w;
    }
    rt->reports[r] = parallelize(*rt->replicas[r], plan, *w);
  });

  // The index clones (see ParamSlot), made after the replicas shed their
  // full tensors.
  std::vector<std::shared_ptr<torch::nn::Module>> index_models;
  {
    at::NoGradGuard no_grad;
    for (int r = 0; r < n; ++r) {
      auto m = clone_of(*model);
      for (auto& p : m->named_parameters()) {
        auto t = p.value();
        t.set_data(at::arange(1, t.numel() + 1, at::TensorOptions().dtype(at::kDouble)).view(t.sizes()));
      }
      index_models.push_back(m);
    }
  }
  rt->run([&](int r) { parallelize(*index_models[r], plan, *rt->worlds[r]); });

  std::vector<torch::OrderedDict<std::string, at::Tensor>> replica_params, index_params;
  for (int r = 0; r < n; ++r) {
    replica_params.push_back(rt->replicas[r]->named_parameters());
    index_params.push_back(index_models[r]->named_parameters());
  }
  std::unordered_set<const void*> exposed;  // TensorImpls already exposed (tied parameters)
  for (const auto& kv : model->named_parameters()) {
    ParamSlot s;
    s.name = kv.key();
    s.global_shape = kv.value().sizes().vec();
    const int64_t numel = kv.value().numel();
    std::vector<at::Tensor> idx;
    for (int r = 0; r < n; ++r) {
      s.tensor.push_back(find_named(replica_params[r], s.name, "parameter", r));
      idx.push_back(find_named(index_params[r], s.name, "parameter", r).detach());
      const auto& t = idx.back();
      if (t.sizes() != s.tensor.back().sizes())
        throw Error("TensorParallel: parameter '" + s.name + "' is sharded inconsistently on rank " +
                    std::to_string(r));
      if (t.numel() && (!at::equal(t, t.round()) || t.min().item<double>() < 0 ||
                        t.max().item<double>() > static_cast<double>(numel)))
        throw Error("TensorParallel: parameter '" + s.name + "': the plugin's shard on rank " + std::to_string(r) +
                    " is not a selection of the full tensor's elements, so state_dict() cannot gather it");
      if (t.sizes() != kv.value().sizes() ||
          !at::equal(t, at::arange(1, numel + 1, t.options()).view(t.sizes())))
        s.whole = false;
    }
    if (!s.whole) {
      auto covered = at::zeros({numel}, at::TensorOptions().dtype(at::kBool));
      for (auto& t : idx) {
        auto flat = t.reshape({-1}).to(at::kLong);
        flat = flat.masked_select(flat > 0) - 1;
        covered.index_fill_(0, flat, true);
        // Compact: 4 bytes per shard element where the full tensor allows.
        s.index.push_back(t.to(numel < (int64_t(1) << 31) ? at::kInt : at::kLong));
      }
      if (!covered.all().item<bool>())
        throw Error("TensorParallel: parameter '" + s.name +
                    "': the ranks' shards do not cover the full tensor, so state_dict() cannot gather it");
    }
    // Ranks holding the same elements hold equal values (their gradients are
    // equal), so only the first of them is exposed to the optimizer.
    for (int r = 0; r < n; ++r) {
      int h = r;
      for (int q = 0; q < r; ++q)
        if (s.whole || (idx[q].sizes() == idx[r].sizes() && at::equal(idx[q], idx[r]))) {
          h = q;
          break;
        }
      s.holder.push_back(h);
    }
    s.exposed_elsewhere = !exposed.insert(s.tensor[0].unsafeGetTensorImpl()).second;
    rt->params.push_back(std::move(s));
  }
  index_models.clear();
  for (const auto& kv : model->named_buffers()) rt->buffer_names.push_back(kv.key());

  // parameters() / named_parameters(): one module per rank ("rank0", ...)
  // mirroring the model's paths, holding that rank's parameters where it is
  // their holder: every shard of a split parameter once (rank<k>.fc1.weight),
  // every replicated parameter once (rank0.fc3.weight). So a standard
  // optimizer keeps one state per element, weight decay and
  // clip_grad_norm_ count each element once, and the element count equals
  // the unsharded model's. The other ranks' replicated copies follow their
  // holder (copied before each forward). They still require
  // grad, so every rank's graph contains the same collectives.
  for (int r = 0; r < n; ++r) {
    auto root = register_module("rank" + std::to_string(r),
                                std::make_shared<torch::nn::Module>("shardplan::TensorParallel::Shards"));
    for (auto& s : rt->params) {
      if (s.holder[r] != r || s.exposed_elsewhere) continue;
      std::string leaf;
      torch::nn::Module& m = mirror_at(*root, s.name, leaf);
      m.register_parameter(leaf, s.tensor[r], s.tensor[r].requires_grad());
    }
  }
  rt->anchor = at::zeros({0}, at::TensorOptions().dtype(at::kFloat)).requires_grad_(true);
  rt_ = std::move(rt);
}

TensorParallelImpl::~TensorParallelImpl() = default;

// ---------------------------------------------------------------- running

void TensorParallelImpl::train(bool on) {
  torch::nn::Module::train(on);
  for (auto& m : rt_->replicas) m->train(on);
}

namespace {
[[noreturn]] void reject_to() {
  throw Error("TensorParallel: to() is not supported on the wrapper; convert the model (dtype, device) before "
              "wrapping it");
}
}  // namespace

void TensorParallelImpl::to(torch::Device, torch::Dtype, bool) { reject_to(); }
void TensorParallelImpl::to(torch::Dtype, bool) { reject_to(); }
void TensorParallelImpl::to(torch::Device, bool) { reject_to(); }

int TensorParallelImpl::world_size() const { return rt_->n; }
const std::vector<std::string>& TensorParallelImpl::devices() const { return rt_->devices; }

const ParallelReport& TensorParallelImpl::report(int rank) const {
  if (rank < 0 || rank >= rt_->n)
    throw Error("TensorParallel: no rank " + std::to_string(rank) + " of " + std::to_string(rt_->n));
  return rt_->reports[rank];
}

std::shared_ptr<torch::nn::Module> TensorParallelImpl::replica(int rank) const {
  report(rank);  // range check
  return rt_->replicas[rank];
}

void TensorParallelImpl::pretty_print(std::ostream& stream) const {
  stream << "shardplan::TensorParallel(" << rt_->prototype->name() << ", devices=[";
  for (size_t i = 0; i < rt_->devices.size(); ++i) stream << (i ? ", " : "") << rt_->devices[i];
  stream << "])";
}

}  // namespace shardplan
