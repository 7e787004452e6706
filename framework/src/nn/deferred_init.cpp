// Deferred initialisation (shardplan/nn/deferred_init.h).
//
// Two marks, because sharding changes a parameter's storage but not its
// tensor: replace_parameter gives the same TensorImpl its shard (set_data),
// over the zero page again, and ZeRO-3 then frees it for a slice of ordinary
// memory holding zeros. So
//   - "over the zero page" is a property of the storage (its deleter), and
//     tells materialize_deferred what still needs memory;
//   - "never filled" is a property of the TensorImpl, kept in a registry of
//     weak pointers, and is what forward checks: a shard cut from a deferred
//     tensor holds zeros that no load wrote.
#include "shardplan/nn/deferred_init.h"

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#include <torch/nn/module.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>

#include "base/shape_text.h"
#include "shardplan/error.h"

namespace shardplan {
namespace nn {
namespace {

thread_local const DeferredInit* current = nullptr;
thread_local bool reading_deferred = false;

// A write into a deferred parameter (model code initialising it under
// DeferredInit) faults on the read-only page. The handler says so before
// the process dies as it would have; faults elsewhere go to the handler
// that was installed before (a sanitizer's, or the default). The ranges of
// live mappings sit in fixed slots so the handler reads them without locks.
constexpr int kSlots = 8192;
std::atomic<uintptr_t> slot_begin[kSlots], slot_end[kSlots];
struct sigaction previous_segv;

void on_segv(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (int i = 0; i < kSlots; ++i) {
    if (addr >= slot_begin[i].load(std::memory_order_relaxed) && addr < slot_end[i].load(std::memory_order_relaxed)) {
      static const char msg[] =
          "shardplan: a write into a parameter built under shardplan::nn::DeferredInit, which has no memory until "
          "load_weights (or materialize_deferred) gives it some: skip initialising parameters while "
          "shardplan::nn::deferring()\n";
      ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
      (void)ignored;
      break;
    }
  }
  if (previous_segv.sa_flags & SA_SIGINFO) {
    previous_segv.sa_sigaction(sig, info, context);
  } else if (previous_segv.sa_handler != SIG_DFL && previous_segv.sa_handler != SIG_IGN) {
    previous_segv.sa_handler(sig);
  } else {
    signal(sig, SIG_DFL);  // returning re-runs the write, which now ends the process as before
  }
}

void install_segv_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = &on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
  });
}

void remember_range(void* p, size_t bytes, bool live) {
  const auto b = reinterpret_cast<uintptr_t>(p);
  for (int i = 0; i < kSlots; ++i) {
    if (live) {
      uintptr_t empty = 0;
      if (slot_begin[i].compare_exchange_strong(empty, b)) {
        slot_end[i].store(b + bytes);
        return;
      }
    } else if (slot_begin[i].load() == b) {
      slot_end[i].store(0);
      slot_begin[i].store(0);
      return;
    }
  }
}

struct Mapping {
  void* addr;
  size_t bytes;
};

void unmap(void* ctx) {
  auto* m = static_cast<Mapping*>(ctx);
  remember_range(m->addr, m->bytes, false);
  munmap(m->addr, m->bytes);
  delete m;
}

// Over the zero page: PROT_READ anonymous memory commits nothing, counts
// toward no RLIMIT_DATA, and reads as zeros; MAP_NORESERVE keeps it out of
// the overcommit accounting too.
at::Tensor zero_page_tensor(at::IntArrayRef sizes, at::ScalarType dtype, const char* name) {
  // Checked: sizes from a config file can multiply past 64 bits.
  uint64_t bytes = c10::elementSize(dtype);
  bool overflow = false;
  for (int64_t s : sizes) overflow |= s < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(s), &bytes);
  bytes = std::max<uint64_t>(1, bytes);
  void* p = overflow ? MAP_FAILED : mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw Error("DeferredInit: cannot reserve " + (overflow ? std::string("over 2^64") : std::to_string(bytes)) +
                " bytes of address space for parameter " + (*name ? std::string("'") + name + "' " : "") +
                shape_str(sizes) + " (" + c10::toString(dtype) + ")");
  remember_range(p, bytes, true);
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
    if (it != unfilled.end() && it->second.lock().get() == t.unsafeGetTensorImpl()) return true;
    // Entries of models dropped unfilled would keep every later forward on
    // this path: clear them, so that `live` falls back to zero.
    sweep();
    live = unfilled.size();
    return false;
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
  install_segv_handler();
  current = this;
}

DeferredInit::~DeferredInit() { current = previous_; }

bool deferring() { return current != nullptr; }

at::Tensor empty_parameter(at::IntArrayRef sizes, const char* name) {
  if (!current) return at::empty(sizes);
  at::Tensor t = zero_page_tensor(sizes, current->dtype_, name);
  registry().add(t);
  return t;
}

bool is_deferred(const at::Tensor& t) { return registry().has(t); }

ReadDeferred::ReadDeferred() : previous_(reading_deferred) { reading_deferred = true; }
ReadDeferred::~ReadDeferred() { reading_deferred = previous_; }

void check_materialized(const at::Tensor& t, const char* layer, const char* what) {
  if (!reading_deferred && is_deferred(t))
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
                  " bytes of parameters and needs " + std::to_string(needed) +
                  " more for its shards and unsharded parameters; shard the model over more ranks (a plan) or give "
                  "each rank more memory");
    }
    p.set_data(mem);
    names.push_back(kv.key());
  }
  return names;
}

void mark_filled(const at::Tensor& t) { registry().remove(t); }

bool over_zero_page(const at::Tensor& t) { return nn::over_zero_page(t); }

at::Tensor zero_page_like(at::IntArrayRef sizes, at::ScalarType dtype) { return zero_page_tensor(sizes, dtype, ""); }

void release_to_zero_page(at::Tensor& p) {
  if (over_zero_page(p)) return;  // never given memory (built under DeferredInit)
  at::NoGradGuard no_grad;
  p.set_data(zero_page_tensor(p.sizes(), p.scalar_type(), ""));
  registry().add(p);
}

}  // namespace detail

int64_t resident_parameter_bytes(const torch::nn::Module& model) {
  std::set<const void*> seen;  // a tied tensor once
  int64_t bytes = 0;
  for (const auto& p : model.parameters(/*recurse=*/true))
    if (p.has_storage() && !over_zero_page(p) && seen.insert(p.storage().unsafeGetStorageImpl()).second)
      bytes += static_cast<int64_t>(p.storage().nbytes());
  return bytes;
}

std::vector<std::string> materialize_deferred(torch::nn::Module& model) {
  auto names = detail::give_memory(model, /*zero=*/true);
  for (auto& p : model.parameters(/*recurse=*/true)) detail::mark_filled(p);
  return names;
}

}  // namespace nn
}  // namespace shardplan
