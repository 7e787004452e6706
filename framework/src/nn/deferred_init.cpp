// Deferred initialisation (shardplan/nn/deferred_init.h).
//
// Two marks, because sharding changes a parameter's storage but not its
// tensor: replace_parameter gives the same TensorImpl a clone of its slice
// (set_data), and that clone is ordinary memory holding zeros. So
//   - "over the zero page" is a property of the storage (its deleter), and
//     tells materialize_deferred what still needs memory;
//   - "never filled" is a property of the TensorImpl, kept in a registry of
//     weak pointers, and is what forward checks: a shard cut from a deferred
//     tensor holds zeros that no load wrote.
#include "shardplan/nn/deferred_init.h"

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>
#include <sys/mman.h>
#include <torch/nn/module.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "shardplan/error.h"

namespace shardplan {
namespace nn {
namespace {

thread_local const DeferredInit* current = nullptr;

struct Mapping {
  void* addr;
  size_t bytes;
};

void unmap(void* ctx) {
  auto* m = static_cast<Mapping*>(ctx);
  munmap(m->addr, m->bytes);
  delete m;
}

// Over the zero page: PROT_READ anonymous memory commits nothing, counts
// toward no RLIMIT_DATA, and reads as zeros; MAP_NORESERVE keeps it out of
// the overcommit accounting too.
at::Tensor zero_page_tensor(at::IntArrayRef sizes, at::ScalarType dtype) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  const size_t bytes = std::max<size_t>(1, static_cast<size_t>(n) * c10::elementSize(dtype));
  void* p = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw Error("DeferredInit: cannot reserve " + std::to_string(bytes) + " bytes of address space for a parameter");
  c10::DataPtr data(p, new Mapping{p, bytes}, &unmap, c10::Device(c10::kCPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, std::move(data), nullptr, /*resizable=*/false);
  at::Tensor t = at::empty({0}, at::TensorOptions().dtype(dtype));
  at::NoGradGuard no_grad;
  t.set_(storage, 0, sizes, c10::contiguous_strides(sizes));
  return t;
}

bool over_zero_page(const at::Tensor& t) {
  return t.defined() && t.has_storage() && t.storage().data_ptr().get_deleter() == &unmap;
}

// TensorImpls made under DeferredInit and not yet filled. `live` lets
// forward skip the lock while no deferred parameter exists (the usual case).
struct Registry {
  std::mutex mutex;
  std::unordered_map<const c10::TensorImpl*, c10::weak_intrusive_ptr<c10::TensorImpl>> unfilled;
  std::atomic<size_t> live{0};

  void add(const at::Tensor& t) {
    std::lock_guard<std::mutex> lock(mutex);
    sweep();
    unfilled.insert_or_assign(t.unsafeGetTensorImpl(), c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()));
    live = unfilled.size();
  }
  bool has(const at::Tensor& t) {
    if (!live.load(std::memory_order_relaxed) || !t.defined()) return false;
    std::lock_guard<std::mutex> lock(mutex);
    auto it = unfilled.find(t.unsafeGetTensorImpl());
    // An address can be reused by a new tensor once the old one died.
    return it != unfilled.end() && it->second.lock().get() == t.unsafeGetTensorImpl();
  }
  void remove(const at::Tensor& t) {
    std::lock_guard<std::mutex> lock(mutex);
    unfilled.erase(t.unsafeGetTensorImpl());
    sweep();
    live = unfilled.size();
  }
  // Models dropped unfilled leave expired entries; keep the map bounded.
  void sweep() {
    for (auto it = unfilled.begin(); it != unfilled.end();) it = it->second.expired() ? unfilled.erase(it) : ++it;
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

DeferredInit::DeferredInit(at::ScalarType dtype) : previous_(current), dtype_(dtype) {
  if (!at::isFloatingType(dtype))
    throw Error(std::string("DeferredInit: parameters need a floating dtype, got ") + c10::toString(dtype));
  current = this;
}

DeferredInit::~DeferredInit() { current = previous_; }

bool deferring() { return current != nullptr; }

at::Tensor empty_parameter(at::IntArrayRef sizes) {
  if (!current) return at::empty(sizes);
  at::Tensor t = zero_page_tensor(sizes, current->dtype_);
  registry().add(t);
  return t;
}

bool is_deferred(const at::Tensor& t) { return registry().has(t); }

void check_materialized(const at::Tensor& t, const char* layer, const char* what) {
  if (is_deferred(t))
    throw Error(std::string(layer) + ": its " + what +
                " was built under DeferredInit and never filled (load_weights fills it; materialize_deferred gives "
                "it zeros): computing with it would give numbers no weight file holds");
}

namespace detail {

// For load_weights: memory without zeros, since it writes every element.
// Out of memory here is the usual way a model too large for one rank
// fails, so the message says what this rank needed and what to change.
std::vector<std::string> give_memory(torch::nn::Module& model, bool zero) {
  std::vector<std::string> names;
  int64_t held = 0, needed = 0;
  for (const auto& p : model.parameters(/*recurse=*/true))
    (over_zero_page(p) ? needed : held) += p.numel() * static_cast<int64_t>(p.element_size());
  at::NoGradGuard no_grad;
  for (auto& kv : model.named_parameters(/*recurse=*/true)) {
    at::Tensor& p = kv.value();
    if (!over_zero_page(p)) continue;  // a tied tensor's second name: already given memory
    at::Tensor mem;
    try {
      mem = zero ? at::zeros(p.sizes(), p.options()) : at::empty(p.sizes(), p.options());
    } catch (const c10::Error&) {
      throw Error("out of memory giving parameter '" + kv.key() + "' its " +
                  std::to_string(p.numel() * p.element_size()) + " bytes: this rank holds " + std::to_string(held) +
                  " bytes of shards and needs " + std::to_string(needed) +
                  " more for its unsharded parameters; shard the model over more ranks (a plan) or give each rank "
                  "more memory");
    }
    p.set_data(mem);
    names.push_back(kv.key());
  }
  return names;
}

void mark_filled(const at::Tensor& t) { registry().remove(t); }

}  // namespace detail

std::vector<std::string> materialize_deferred(torch::nn::Module& model) {
  auto names = detail::give_memory(model, /*zero=*/true);
  for (auto& p : model.parameters(/*recurse=*/true)) detail::mark_filled(p);
  return names;
}

}  // namespace nn
}  // namespace shardplan
