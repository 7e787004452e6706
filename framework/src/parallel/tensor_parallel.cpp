#include "shardplan/tensor_parallel.h"

#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_set>

#include "shardplan/error.h"
#include "shardplan/world.h"

namespace shardplan {

namespace detail {
void forward_arity_error(size_t expected, size_t got) {
  throw Error("TensorParallel: the model's forward takes " + std::to_string(expected) + " tensor argument(s), got " +
              std::to_string(got) + " (pass every argument, or give TensorParallel a ReplicaForward)");
}
}  // namespace detail

namespace {

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

// One thread per rank, alive as long as the wrapper: a rank's World, its
// RNG tracker (thread-local) and its communicators belong to its thread, and
// every job (set up, forward, backward) must reach all ranks at once.
class Workers {
 public:
  explicit Workers(int n) : n_(n) {
    for (int r = 0; r < n; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~Workers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // Runs job(rank) on every worker and waits for all. The first job to throw
  // calls on_failure (which aborts the communicators, so ranks waiting for
  // the failed one in a collective fail too instead of hanging); its error
  // is rethrown here naming its rank.
  void run(const std::function<void(int)>& job, const std::function<void()>& on_failure) {
    std::unique_lock<std::mutex> lock(mu_);
    job_ = job;
    on_failure_ = on_failure;
    pending_ = n_;
    first_error_ = nullptr;
    failed_rank_ = -1;
    ++generation_;
    wake_.notify_all();
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
    if (!first_error_) return;
    try {
      std::rethrow_exception(first_error_);
    } catch (const c10::Error& e) {
      throw Error("TensorParallel: rank " + std::to_string(failed_rank_) + ": " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      throw Error("TensorParallel: rank " + std::to_string(failed_rank_) + ": " + e.what());
    } catch (...) {
      throw Error("TensorParallel: rank " + std::to_string(failed_rank_) + ": unknown exception");
    }
  }

 private:
  void loop(int r) {
    uint64_t seen = 0;
    for (;;) {
      std::function<void(int)> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      std::exception_ptr error;
      try {
        job(r);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (error && !first_error_) {
        first_error_ = error;
        failed_rank_ = r;
        if (on_failure_) on_failure_();
      }
      if (--pending_ == 0) done_.notify_all();
    }
  }

  const int n_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  std::function<void(int)> job_;
  std::function<void()> on_failure_;
  int pending_ = 0;
  std::exception_ptr first_error_;
  int failed_rank_ = -1;
};

// The first line of an exception's message (c10::Error appends a backtrace).
std::string message_of(const std::exception& e) {
  const auto* c10e = dynamic_cast<const c10::Error*>(&e);
  std::string m = c10e ? c10e->what_without_backtrace() : e.what();
  auto nl = m.find('\n');
  return nl == std::string::npos ? m : m.substr(0, nl);
}

}  // namespace

// Where every element of a replica's parameter comes from in the full one.
//
// The plugins know how they shard (contiguous or uneven chunks, `blocks: k`,
// gate-aware LSTM splits, ...), and a checkpoint needs exactly that
// knowledge backwards. Instead of re-deriving it from the report's layout
// strings for each plugin, the wrapper asks the plugins themselves once: it
// shards one more clone per rank whose parameters hold 1 + their flat index
// (float64 is exact up to 2^53 elements) and reads back which full-tensor
// element each shard element is. Any plugin that slices gets state_dict()
// and load_state_dict() for free; one that computed values from several
// elements would be caught (non-integral or missing indices).
struct ParamSlot {
  std::string name;                    // original path, "fc1.weight"
  std::vector<int64_t> global_shape;
  bool whole = true;                   // every rank holds the full tensor
  std::vector<at::Tensor> index;       // per rank, when !whole: flat index + 1 (0: not from the full tensor)
  std::vector<int> holder;             // per rank: the rank whose copy stands for it (itself when exposed)
  std::vector<at::Tensor> tensor;      // per rank: the replica's parameter
  bool exposed_elsewhere = false;      // a tied parameter already exposed under another name
};

struct TensorParallelImpl::Runtime {
  int n = 0;
  std::vector<std::string> devices;
  ReplicaForward forward_fn;
  std::shared_ptr<torch::nn::Module> prototype;  // the caller's model: structure for save()/load()
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  std::vector<ParallelReport> reports;
  std::vector<ParamSlot> params;
  std::vector<std::string> buffer_names;

  std::mutex worlds_mu;
  std::vector<std::shared_ptr<World>> worlds;

  std::mutex call_mu;  // one job at a time; also keeps state_dict() off a running step
  std::string broken;  // set by the first failure
  at::Tensor anchor;   // makes the output require grad when only the replicas' parameters do

  // Declared last: destroyed first, so the threads are gone before what
  // they use.
  std::unique_ptr<Workers> workers;

  void abort_all() {
    std::lock_guard<std::mutex> lock(worlds_mu);
    for (auto& w : worlds)
      if (w) w->comm().abort();  // groups split from the world inherit the abort
  }

  void run(const std::function<void(int)>& job) {
    if (!broken.empty())
      throw Error("TensorParallel: unusable after an earlier failure (" + broken +
                  "); its collectives are incomplete, so build a new TensorParallel");
    try {
      workers->run(job, [this] { abort_all(); });
    } catch (const Error& e) {
      broken = e.what();
      throw;
    }
  }

  // Non-holders take their holder's values before the ranks compute with
  // them. Always: optimizers update through .data(), which no version
  // counter sees. Through variable_data(), so the copy bumps no version
  // either and a graph still waiting for its backward stays valid (the
  // values only change where an optimizer step changed the holder's).
  void sync_replicated(int r) {
    at::NoGradGuard no_grad;
    for (auto& p : params) {
      const int h = p.holder[r];
      if (h == r) continue;
      p.tensor[r].variable_data().copy_(p.tensor[h]);
      // Its gradient equals the holder's and is never read; dropping it keeps
      // it from growing across steps nobody zeroes.
      p.tensor[r].mutable_grad().reset();
    }
  }
};

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

at::Tensor find_named(const torch::OrderedDict<std::string, at::Tensor>& dict, const std::string& name,
                      const char* what, int rank) {
  const at::Tensor* t = dict.find(name);
  if (!t)
    throw Error("TensorParallel: rank " + std::to_string(rank) + "'s replica has no " + what + " '" + name +
                "' after parallelize");
  return *t;
}

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

// ---------------------------------------------------------------- checkpoints

torch::OrderedDict<std::string, at::Tensor> TensorParallelImpl::state_dict() const {
  auto& rt = *rt_;
  std::lock_guard<std::mutex> lock(rt.call_mu);
  at::NoGradGuard no_grad;
  torch::OrderedDict<std::string, at::Tensor> out;
  for (const auto& s : rt.params) {
    at::Tensor full;
    if (s.whole) {
      full = s.tensor[0].detach().clone();
    } else {
      full = at::empty(s.global_shape, s.tensor[0].options());
      auto flat = full.view({-1});
      for (int r = 0; r < rt.n; ++r) {
        if (s.holder[r] != r) continue;
        auto idx = s.index[r].reshape({-1}).to(at::kLong);
        auto keep = idx > 0;
        flat.index_put_({idx.masked_select(keep) - 1}, s.tensor[r].detach().reshape({-1}).masked_select(keep));
      }
    }
    out.insert(s.name, full);
  }
  auto buffers = rt.replicas[0]->named_buffers();
  for (const auto& name : rt.buffer_names) out.insert(name, find_named(buffers, name, "buffer", 0).detach().clone());
  return out;
}

void TensorParallelImpl::load_state_dict(const torch::OrderedDict<std::string, at::Tensor>& full) {
  auto& rt = *rt_;
  std::lock_guard<std::mutex> lock(rt.call_mu);
  std::unordered_set<std::string> known;
  for (const auto& s : rt.params) known.insert(s.name);
  for (const auto& b : rt.buffer_names) known.insert(b);
  for (const auto& kv : full)
    if (!known.count(kv.key()))
      throw Error("TensorParallel::load_state_dict: unexpected entry '" + kv.key() + "' (not in the model)");
  auto get = [&](const std::string& name, at::IntArrayRef shape) {
    const at::Tensor* t = full.find(name);
    if (!t) throw Error("TensorParallel::load_state_dict: missing entry '" + name + "'");
    if (t->sizes() != shape)
      throw Error("TensorParallel::load_state_dict: '" + name + "' has shape " + shape_str(t->sizes()) +
                  ", the model's is " + shape_str(shape));
    return *t;
  };
  // Everything is checked before anything is written.
  for (const auto& s : rt.params) get(s.name, s.global_shape);
  std::vector<torch::OrderedDict<std::string, at::Tensor>> buffers;
  for (int r = 0; r < rt.n; ++r) buffers.push_back(rt.replicas[r]->named_buffers());
  for (const auto& b : rt.buffer_names) get(b, find_named(buffers[0], b, "buffer", 0).sizes());

  at::NoGradGuard no_grad;
  for (auto& s : rt.params) {
    const at::Tensor src = get(s.name, s.global_shape);
    for (int r = 0; r < rt.n; ++r) {
      at::Tensor dst = s.tensor[r];
      if (s.whole) {
        dst.copy_(src);
        continue;
      }
      auto idx = s.index[r].to(at::kLong);
      auto picked = src.reshape({-1}).index_select(0, (idx - 1).clamp_min(0).reshape({-1})).view(idx.sizes());
      dst.copy_(at::where(idx > 0, picked.to(dst.scalar_type()), dst));
    }
  }
  for (const auto& b : rt.buffer_names)
    for (int r = 0; r < rt.n; ++r) find_named(buffers[r], b, "buffer", r).copy_(full[b]);
}

namespace {

// Module::save's layout for the plain model: a module's own parameters and
// buffers by name, then one nested archive per serializable child.
void save_tree(const torch::nn::Module& m, const std::string& prefix,
               const torch::OrderedDict<std::string, at::Tensor>& full, torch::serialize::OutputArchive& archive) {
  for (const auto& p : m.named_parameters(/*recurse=*/false)) archive.write(p.key(), full[prefix + p.key()]);
  for (const auto& b : m.named_buffers(/*recurse=*/false))
    archive.write(b.key(), full[prefix + b.key()], /*is_buffer=*/true);
  for (const auto& c : m.named_children()) {
    if (!c.value()->is_serializable()) continue;
    torch::serialize::OutputArchive child(archive.compilation_unit());
    save_tree(*c.value(), prefix + c.key() + ".", full, child);
    archive.write(c.key(), child);
  }
}

void load_tree(const torch::nn::Module& m, const std::string& prefix, torch::serialize::InputArchive& archive,
               torch::OrderedDict<std::string, at::Tensor>& full) {
  for (const auto& p : m.named_parameters(/*recurse=*/false)) {
    at::Tensor t;
    archive.read(p.key(), t);
    full.insert(prefix + p.key(), t);
  }
  for (const auto& b : m.named_buffers(/*recurse=*/false)) {
    at::Tensor t;
    archive.read(b.key(), t, /*is_buffer=*/true);
    full.insert(prefix + b.key(), t);
  }
  for (const auto& c : m.named_children()) {
    if (!c.value()->is_serializable()) continue;
    torch::serialize::InputArchive child;
    archive.read(c.key(), child);
    load_tree(*c.value(), prefix + c.key() + ".", child, full);
  }
}

}  // namespace

void TensorParallelImpl::save(torch::serialize::OutputArchive& archive) const {
  save_tree(*rt_->prototype, "", state_dict(), archive);
}

void TensorParallelImpl::load(torch::serialize::InputArchive& archive) {
  torch::OrderedDict<std::string, at::Tensor> full;
  load_tree(*rt_->prototype, "", archive, full);
  load_state_dict(full);
}

}  // namespace shardplan
