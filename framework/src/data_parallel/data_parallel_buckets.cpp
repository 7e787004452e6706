// DataParallel's buckets: how gradients are packed and hooked, and the
// float32 gradient accumulation of mixed precision (Megatron's main_grad):
// the buckets themselves are the accumulation buffers.
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "data_parallel_impl.h"
#include "shardplan/error.h"
#include "shardplan/recompute.h"

namespace shardplan {

at::ScalarType reduce_dtype_of(const DataParallelSpec& spec) {
  static const std::map<std::string, at::ScalarType> kDtypes = {
      {"float32", at::kFloat}, {"bfloat16", at::kBFloat16}, {"float16", at::kHalf}, {"float64", at::kDouble}};
  if (spec.reduce_dtype.empty()) return at::ScalarType::Undefined;
  const auto it = kDtypes.find(spec.reduce_dtype);
  if (it == kDtypes.end())  // the plan parser refuses these; a Plan built in code may not
    throw PlanError(spec.reduce_dtype_loc, "data_parallel.reduce_dtype must be float32, bfloat16, float16 or "
                                           "float64, got '" + spec.reduce_dtype + "'");
  return it->second;
}

void DataParallel::Impl::build_buckets() {
  entries.clear();
  buckets.clear();
  bucket_infos.clear();
  // Reverse registration order: backward produces the last layers' gradients
  // first. One bucket per dtype and device at a time.
  // ZeRO-3: a unit's parameters are a bucket of their own, whatever its size.
  // The first bucket of each dtype and device closes at first_bucket_bytes
  // (DDP's 1 MiB): it holds the last layers' gradients, so its reduction
  // runs while backward computes the rest instead of all of it waiting for
  // backward's end. Averages are element-wise: the layout changes no bit.
  std::map<std::tuple<int, std::string, int>, size_t> open;  // (dtype, device, unit) -> bucket index
  std::vector<bool> is_first;  // per bucket: the first of its key
  for (auto it = to_average.rbegin(); it != to_average.rend(); ++it) {
    const at::Tensor& p = it->second;
    const at::ScalarType dtype = main() ? main_dtype : p.scalar_type();
    const auto u = unit_of_path.find(it->first);
    const int unit = u == unit_of_path.end() ? -1 : u->second;
    const auto key = std::make_tuple(static_cast<int>(dtype), p.device().str(), unit);
    auto o = open.find(key);
    const auto cap = [&](size_t b) { return is_first[b] ? std::min(first_bucket_bytes, bucket_bytes) : bucket_bytes; };
    if (o == open.end() || (unit < 0 && buckets[o->second].info.bytes() >= cap(o->second))) {
      is_first.push_back(o == open.end());
      buckets.emplace_back();
      buckets.back().unit = unit;
      buckets.back().info.dtype = dtype;
      buckets.back().info.element_size = static_cast<int64_t>(c10::elementSize(dtype));
      o = open.insert_or_assign(key, buckets.size() - 1).first;
    }
    Bucket& b = buckets[o->second];
    Entry e;
    e.path = it->first;
    e.param = p;
    e.bucket = o->second;
    e.offset = b.info.numel;
    e.numel = p.numel();
    e.sizes = p.sizes().vec();
    e.unit = unit;
    b.info.numel += p.numel();
    b.info.params.push_back(e.path);
    b.entries.push_back(entries.size());
    entries.push_back(std::move(e));
  }
  if (folds_flags()) buckets.back().flags = static_cast<int64_t>(entries.size());
  for (auto& b : buckets) {
    // Only a reduce-scatter needs D equal slices.
    b.info.padded = zero ? (b.info.numel + size - 1) / size * size : b.info.numel;
    const at::Tensor& first = entries[b.entries.front()].param;
    b.options = first.options().dtype(b.info.dtype).requires_grad(false);
    // ZeRO-2 keeps no whole gradient between steps: the buffer comes with
    // the bucket's first gradient.
    if (!zero2()) b.flat = at::zeros({b.info.padded + b.flags}, b.options);
    const int64_t n = b.info.padded / size;
    if (zero) b.shard = zero2() ? at::zeros({n}, b.options) : b.flat.narrow(0, rank * n, n);
    b.scale = at::scalar_tensor(1.0 / size, b.options);
    b.pending = b.entries.size();
    bucket_infos.push_back(b.info);
  }
  // Main grads need the hooks without a batch axis too: they are what
  // accumulates in float32.
  if (size > 1 || zero || main()) {
    std::weak_ptr<Impl> weak = self;
    for (size_t i = 0; i < entries.size(); ++i) {
      at::Tensor p = entries[i].param;
      entries[i].hook = p.register_hook([weak, i](const at::Tensor& grad) {
        // A recomputed region's inner pass: the gradient comes again, once,
        // when the region's node hands it to this backward.
        if (in_recompute_backward()) return;
        if (auto impl = weak.lock()) {
          if (impl->main())
            impl->on_main_grad(i, grad);
          else
            impl->on_grad(i, grad);
        }
      });
    }
  }
}

at::Tensor& DataParallel::Impl::ensure_flat(Bucket& b) {
  // Zeros: the padding at the end must add nothing to the reduce-scatter.
  if (!b.flat.defined()) b.flat = at::zeros({b.info.padded + b.flags}, b.options);
  return b.flat;
}

void DataParallel::Impl::release_grads() {
  for (size_t i : to_release) entries[i].param.mutable_grad().reset();
  to_release.clear();
}

// Bucket k's reduce-scatter is waited for once bucket k + keep launched: at
// most keep + 1 whole buckets live at a time, the rest only as slices.
void DataParallel::Impl::drain(size_t keep) {
  for (; next_drain + keep < next_launch; ++next_drain) {
    Bucket& b = buckets[next_drain];
    if (b.work) {
      b.work->wait();
      b.work.reset();
    }
    finish_wire(b);
    b.flat.reset();
  }
}

void DataParallel::Impl::remove_hooks() {
  if (!(size > 1 || zero || main())) return;
  for (auto& e : entries) {
    try {
      e.param.remove_hook(e.hook);
    } catch (...) {
    }
  }
}

void DataParallel::Impl::use_main_grads(at::ScalarType dtype,
                                        const std::vector<std::pair<std::string, at::Tensor>>& all_trainable) {
  std::lock_guard<std::mutex> lock(mu);
  if (main()) {
    if (dtype != main_dtype)
      throw Error("data parallel: gradients already accumulate in " + std::string(c10::toString(main_dtype)) +
                  " for another optimizer; build one optimizer per DataParallel");
    return;
  }
  if (round_open || finished || zero_attached)
    throw Error("data parallel: build the mixed-precision optimizer before the first backward");
  if (stage3())
    throw Error("data parallel: master weights (MixedPrecision::master_dtype) with data_parallel.zero: 3 are not "
                "supported: the slices would need a second dtype; use zero: 1 or 2, or no master dtype");
  remove_hooks();
  main_dtype = dtype;
  // Without a batch axis nothing is averaged, but every trainable parameter
  // still accumulates in the main dtype.
  if (axis.empty()) to_average = all_trainable;
  build_buckets();
}

at::Tensor DataParallel::Impl::main_grad(size_t i) const {
  // Not an autograd view of the bucket (libtorch 1.13's zero_grad()
  // detach_()es .grad, which views refuse), as complete() does for .grad.
  const Entry& e = entries[i];
  const at::Tensor& flat = buckets[e.bucket].flat;
  at::Tensor g = at::empty({0}, flat.options());
  g.set_(flat.storage(), flat.storage_offset() + e.offset, e.sizes);
  return g;
}

void DataParallel::Impl::discard_main_grads() {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& e : entries) {
    e.accumulated = false;
    if (e.param.grad().defined()) e.param.mutable_grad().reset();
  }
  for (auto& b : buckets) {
    b.carry.reset();
    if (zero2()) b.flat.reset();
  }
  to_release.clear();
  main_unconsumed = false;
  finished = false;
  std::fill(zero_used.begin(), zero_used.end(), false);
}

void DataParallel::Impl::keep_main_unconsumed() {
  if (!main_unconsumed || zero) return;
  for (auto& b : buckets) b.carry = b.flat.clone();
  main_unconsumed = false;
}

void DataParallel::Impl::keep_zero_unconsumed() {
  if (!zero || !zero_unconsumed) return;
  for (auto& b : buckets) b.carry = b.shard.clone();
  zero_unconsumed = false;
}

void DataParallel::Impl::finish_wire(Bucket& b) {
  if (b.scattered.defined()) {
    b.shard.copy_(b.scattered);
    b.scattered.reset();
  }
  if (!b.wire.defined()) return;
  if (zero)
    b.shard.copy_(b.wire_shard);
  else
    b.flat.copy_(b.wire);
  b.wire.reset();
  b.wire_shard.reset();
}

// Every gradient, inside NoSync or not, is added into its bucket slot in the
// main dtype (divided by D on the way in, as on_grad does), and the model's
// .grad is dropped, so nothing accumulates in the model's dtype.
void DataParallel::Impl::on_main_grad(size_t index, const at::Tensor& grad) {
  std::lock_guard<std::mutex> lock(mu);
  finished = false;
  keep_main_unconsumed();
  if (no_sync == 0)
    open_round_until_backward_ends();
  else
    keep_zero_unconsumed();  // ZeRO-1's slices are in the buffer this writes
  Entry& e = arriving(index);
  Bucket& b = buckets[e.bucket];
  at::Tensor slot = ensure_flat(b).narrow(0, e.offset, e.numel);
  if (!e.accumulated) slot.zero_();
  slot.add_(grad.reshape(-1), 1.0 / size);
  e.accumulated = e.used = true;
  // Autograd then stores `grad` itself in .grad (no add): dropped at the
  // end of the round.
  e.param.mutable_grad().reset();
  if (zero) {
    release_grads();
    to_release.push_back(index);
  }
  if (no_sync > 0 || !overlap) return;
  e.ready = true;
  if (--b.pending == 0) launch_ready();
}

}  // namespace shardplan
