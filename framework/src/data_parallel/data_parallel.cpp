#include "shardplan/data_parallel.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "data_parallel_impl.h"
#include "replica_check.h"
#include "shardplan/error.h"
#include "shardplan/world.h"

namespace shardplan {
namespace {

bool has_axis(const ReportRow& row, const std::string& axis) {
  for (const auto& s : row.splits)
    if (s.axis == axis) return true;
  return false;
}

std::string mib(int64_t bytes) {
  std::ostringstream s;
  s.precision(3);
  s << bytes / (1024.0 * 1024.0) << " MiB";
  return s.str();
}

}  // namespace

// ------------------------------------------------------------ hooks

void DataParallel::Impl::on_grad(size_t index, const at::Tensor& grad) {
  std::lock_guard<std::mutex> lock(mu);
  finished = false;  // the gradients change: a later finish() must average them
  note_unit_grad(entries[index]);
  if (no_sync > 0) return;
  open_round_until_backward_ends();
  if (!overlap) return;
  Entry& e = arriving(index);
  Bucket& b = buckets[e.bucket];
  at::Tensor slot = ensure_flat(b).narrow(0, e.offset, e.numel);
  // The hook runs before autograd adds `grad` to .grad: the bucket needs the
  // sum, which includes micro-batches accumulated under NoSync. It is
  // divided by D on the way in, as DDP and Megatron do, so that no pass over
  // the gradients follows the wait in finish().
  const at::Tensor& scale = b.scale;
  at::Tensor& acc = e.param.mutable_grad();
  if (acc.defined()) {
    at::add_out(slot, acc.reshape(-1), grad.reshape(-1));
    slot.mul_(scale);
  } else {
    at::mul_out(slot, grad.reshape(-1), scale);
  }
  // After finish() .grad holds the bucket's memory, which this step's
  // reduction is about to read: autograd must put `grad` elsewhere. With
  // .grad unset it keeps `grad` itself (no copy) where it would otherwise
  // add it into .grad, one more pass over the gradient on backward's path.
  acc.reset();
  // ZeRO: and the .grad autograd sets next, at the next hook (it is in the
  // bucket, and the step reads only the slices).
  if (zero) {
    release_grads();
    to_release.push_back(index);
  }
  e.ready = true;
  e.used = true;
  if (--b.pending == 0) launch_ready();
}

void DataParallel::Impl::open_round_until_backward_ends() {
  if (round_open) return;
  open_round();
  // Completed when this backward ends, as DDP finalizes its buckets: the
  // loop needs no finish(), and an optimizer stepping right after
  // backward sees averaged gradients. A weak reference: the callback may
  // outlive this DataParallel.
  torch::autograd::Engine::get_default_engine().queue_callback([weak = self] {
    if (auto impl = weak.lock()) impl->complete();
  });
}

DataParallel::Impl::Entry& DataParallel::Impl::arriving(size_t index) {
  Entry& e = entries[index];
  if (e.ready)
    throw Error("data parallel: the gradient of '" + e.path +
                "' arrived twice in one reduction round (a backward re-entered from a hook?); accumulate "
                "micro-batches inside DataParallel::NoSync");
  return e;
}

// Buckets start in index order only, so every rank issues the same
// collectives in the same order whatever order its gradients arrive in.
void DataParallel::Impl::launch_ready() {
  while (next_launch < buckets.size() && buckets[next_launch].pending == 0) launch(buckets[next_launch++]);
  // ZeRO-2: two buckets reducing while backward fills the next (DeepSpeed's
  // bucket pair), the older ones only slices.
  if (zero2()) drain(2);
}

void DataParallel::Impl::launch(Bucket& b) {
  b.launched = true;
  if (!group || (size == 1 && !zero)) return;
  if (b.flags) write_flags(b);
  if (wire_dtype != at::ScalarType::Undefined && wire_dtype != b.flat.scalar_type()) {
    b.wire = b.flat.to(wire_dtype);
    if (zero) b.wire_shard = at::empty(b.shard.sizes(), b.wire.options());
  }
  at::Tensor& in = b.wire.defined() ? b.wire : b.flat;
  if (zero) {
    // ZeRO-1's slice is part of `in`: the collective writes elsewhere.
    if (!b.wire.defined() && !zero2()) b.scattered = at::empty(b.shard.sizes(), b.shard.options());
    b.work = group->reduce_scatter_async(in, b.wire.defined() ? b.wire_shard
                                             : b.scattered.defined() ? b.scattered : b.shard);
  } else
    b.work = group->all_reduce_async(in);
}

// Parameters whose hook did not fire (overlap off, or no gradient this
// step) contribute their .grad, or zeros: a parameter this rank did not use
// still takes part in the average when another rank used it.
void DataParallel::Impl::fill_and_launch_rest() {
  for (Bucket& b : buckets) {
    if (b.launched) continue;
    for (size_t i : b.entries) {
      Entry& e = entries[i];
      if (e.ready) continue;
      if (main()) {  // every gradient went into the bucket already
        if (!e.accumulated) ensure_flat(b).narrow(0, e.offset, e.numel).zero_();
        e.ready = true;
        continue;
      }
      at::Tensor slot = ensure_flat(b).narrow(0, e.offset, e.numel);
      const at::Tensor& scale = b.scale;
      const at::Tensor& g = e.param.grad();
      e.used = g.defined();
      if (!g.defined())
        slot.zero_();
      else if (g.data_ptr() != slot.data_ptr())  // else .grad is in the bucket already
        at::mul_out(slot, g.reshape(-1), scale);
      else
        slot.mul_(scale);
      e.ready = true;
    }
    b.pending = 0;
  }
  launch_ready();
}

// The flags ride at the end of the last bucket, so they cost no call of
// their own. They are final when it launches: buckets launch in index order,
// each once all its entries are ready (a hook's gradient, or
// fill_and_launch_rest(), which sets `used` of the rest first), so every
// entry of every bucket is ready, and a gradient arriving later for a ready
// entry is refused (arriving()). Sums of 0s and 1s are 0 exactly when no
// rank used a parameter, in any float dtype and any order of addition; they
// are not divided by D (the gradients entered divided).
void DataParallel::Impl::write_flags(Bucket& b) {
  at::Tensor used = at::empty({b.flags}, at::kFloat);
  float* u = used.data_ptr<float>();
  for (size_t i = 0; i < entries.size(); ++i) u[i] = entries[i].used ? 1.0f : 0.0f;
  b.flat.narrow(0, b.info.padded, b.flags).copy_(used);
}

// Which parameters had a gradient on at least one rank of the batch axis
// (DDP's unused-parameter map), every rank the same answer so that every
// rank treats a parameter alike: from the last bucket's tail, or (ZeRO, no
// buckets) one small all-reduce of its own, queued behind the buckets'.
std::vector<bool> DataParallel::Impl::used_anywhere() {
  std::vector<bool> out(entries.size());
  if (folds_flags()) {
    const Bucket& last = buckets.back();
    const at::Tensor any = last.flat.narrow(0, last.info.padded, last.flags).gt(0).cpu();
    const bool* a = any.data_ptr<bool>();
    for (size_t i = 0; i < entries.size(); ++i) out[i] = a[i];
    return out;
  }
  at::Tensor counts = at::empty({static_cast<int64_t>(entries.size())}, at::kInt);  // flag_bytes()
  int32_t* c = counts.data_ptr<int32_t>();
  for (size_t i = 0; i < entries.size(); ++i) c[i] = entries[i].used ? 1 : 0;
  if (group && size > 1 && !buckets.empty()) {
    // On the buckets' device: a GPU backend reduces device memory only.
    at::Tensor on_device = counts.to(buckets.front().options.device());
    group->all_reduce(on_device);
    counts = on_device.cpu();
  }
  c = counts.data_ptr<int32_t>();
  for (size_t i = 0; i < entries.size(); ++i) out[i] = c[i] > 0;
  return out;
}

// ------------------------------------------------------------ construction

namespace {

std::vector<std::pair<std::string, at::Tensor>> named_parameters_of(torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

// ZeRO-3's units: every module whose forward opens a parameter gate, with its own parameters.
std::vector<DataParallel::GatedLayerInfo> gated_layers_of(torch::nn::Module& model) {
  std::vector<DataParallel::GatedLayerInfo> out;
  const auto add = [&](const std::string& path, torch::nn::Module& m) {
    auto* gated = dynamic_cast<nn::GatedLayer*>(&m);
    if (!gated) return;
    DataParallel::GatedLayerInfo info{path, gated, {}};
    const std::string prefix = path.empty() ? "" : path + ".";
    for (const auto& p : m.named_parameters(/*recurse=*/false))
      if (p.value().defined()) info.params.push_back(prefix + p.key());
    out.push_back(std::move(info));
  };
  add("", model);  // not through named_modules(): the model may live on the stack
  for (const auto& item : model.named_modules(std::string(), /*include_self=*/false)) add(item.key(), *item.value());
  return out;
}

}  // namespace

DataParallel::DataParallel(torch::nn::Module& model, const ParallelReport& report, const Plan& plan, World& world)
    : DataParallel(named_parameters_of(model), report, plan, world, gated_layers_of(model)) {}

namespace {

// Before anything is built: ZeRO-3's gates are found in the model's layers.
const std::vector<std::pair<std::string, at::Tensor>>& without_zero3(
    const std::vector<std::pair<std::string, at::Tensor>>& parameters, const Plan& plan) {
  if (plan.data_parallel.zero == 3)
    throw PlanError(plan.data_parallel.zero_loc, "data_parallel: {zero: 3} over a part of a model's parameters (a "
                                                 "pipeline stage) is not supported yet; zero 1 or 2 is");
  return parameters;
}

}  // namespace

DataParallel::DataParallel(const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                           const ParallelReport& report, const Plan& plan, World& world)
    : DataParallel(without_zero3(parameters, plan), report, plan, world, {}) {}

DataParallel::DataParallel(const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                           const ParallelReport& report, const Plan& plan, World& world,
                           const std::vector<GatedLayerInfo>& layers)
    : impl_(std::make_shared<Impl>()) {
  Impl& d = *impl_;
  d.axis = plan.batch_axis();
  if (plan.pipeline.enabled) d.pipe_axis = plan.pipeline.axis;
  const auto& spec = plan.data_parallel;
  if (!d.axis.empty() && !report.mesh.has_axis(d.axis)) {
    if (!spec.batch_axis.empty())
      throw PlanError(spec.batch_axis_loc,
                      "batch_axis '" + d.axis + "' is not an axis of the mesh " + report.mesh.str());
    d.axis.clear();  // a default name the applied mesh lacks
  }
  if (d.axis.empty() && !spec.batch_axis.empty())
    throw PlanError(spec.batch_axis_loc, "batch_axis '" + spec.batch_axis + "' is not an axis of the mesh");
  if (!d.axis.empty() && report.mesh.size() != world.size())
    throw Error("data parallel: the report's mesh " + report.mesh.str() + " has " +
                std::to_string(report.mesh.size()) + " ranks but the world has " + std::to_string(world.size()) +
                "; pass the report parallelize() returned");
  if (spec.zero && d.axis.empty())
    throw PlanError(spec.zero_loc, "data_parallel.zero shards the optimizer over the batch axis, but the mesh " +
                                  report.mesh.str() + " has none (name one with batch_axis)");
  d.zero = spec.zero;
  d.overlap = spec.overlap;
  for (const auto& [name, n] : report.mesh.axes()) {
    d.axis_names.push_back(name);
    d.axis_groups.push_back(n > 1 && report.mesh.size() == world.size() ? world.group(report.mesh, name) : nullptr);
    d.axis_split.emplace_back();
  }
  d.mesh = report.mesh;
  d.world_rank = world.rank();
  d.world = world.comm_ptr();
  if (!d.axis.empty()) {
    d.group = world.group(report.mesh, d.axis);
    d.size = d.group->size();
    d.rank = d.group->rank();
  }

  std::map<std::string, const ReportRow*> rows;
  for (const auto& r : report.rows) rows[r.path] = &r;
  std::set<const void*> seen;
  std::vector<size_t> ignore_hits(spec.ignore.size(), 0);
  std::vector<std::pair<std::string, at::Tensor>> to_average;
  for (const auto& [key, p] : parameters) {
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;  // a tied tensor: reduced once
    d.unique.emplace_back(key, p);
    const auto it = rows.find(key);
    d.unique_rows.push_back(it != rows.end() ? *it->second : ReportRow{});
    for (size_t a = 0; a < d.axis_names.size(); ++a)
      if (it != rows.end() && has_axis(*it->second, d.axis_names[a])) d.axis_split[a].push_back(key);
    if (d.axis.empty()) continue;
    if (it != rows.end() && has_axis(*it->second, d.axis)) {
      d.split.push_back(key);
      continue;
    }
    // Every regex of a plan follows its `paths:` setting, as the rules do.
    const std::string& plan_name = it != rows.end() && !it->second->plan_path.empty() ? it->second->plan_path
                                                                                        : key;
    bool ignored = false;
    for (size_t i = 0; i < spec.ignore.size(); ++i)
      if (spec.ignore[i].matches(plan_name)) {
        ++ignore_hits[i];
        ignored = true;
        break;
      }
    if (ignored) {
      d.ignored.push_back(key);
      d.ignored_as.push_back(plan_name);
      continue;
    }
    if (!p.requires_grad()) continue;
    d.averaged.push_back(key);
    to_average.emplace_back(key, p);
  }
  for (size_t i = 0; i < spec.ignore.size(); ++i)
    if (ignore_hits[i] == 0 && !d.axis.empty())
      d.warnings.push_back(spec.ignore[i].pattern_loc.str() + ": data_parallel.ignore '" +
                           spec.ignore[i].pattern + "' matches no parameter");

  d.to_average = std::move(to_average);
  d.bucket_bytes = spec.bucket_bytes;
  d.first_bucket_bytes = spec.first_bucket_bytes;
  d.wire_dtype = reduce_dtype_of(spec);
  d.self = impl_;
  const char* prefetch = std::getenv("SHARDPLAN_ZERO3_PREFETCH");
  d.prefetch = prefetch == nullptr || std::string(prefetch) != "0";
  if (d.stage3()) d.plan_units(layers, parameters);
  d.build_buckets();
  if (d.stage3()) d.shard_units();
}

DataParallel::~DataParallel() {
  impl_->remove_gates();
  impl_->remove_hooks();
  // Waiting is the only safe end for a reduction still running into our buffers.
  for (auto& b : impl_->buckets)
    if (b.work) try {
        b.work->wait();
      } catch (...) {
      }
}

// ------------------------------------------------------------ accessors

const std::string& DataParallel::axis() const { return impl_->axis; }
int DataParallel::size() const { return impl_->size; }
int DataParallel::rank() const { return impl_->rank; }
bool DataParallel::zero() const { return impl_->zero >= 1; }
int DataParallel::zero_stage() const { return impl_->zero; }
Communicator* DataParallel::group() const { return impl_->group.get(); }
const std::vector<GradBucket>& DataParallel::buckets() const { return impl_->bucket_infos; }
const std::vector<std::string>& DataParallel::averaged() const { return impl_->averaged; }
const std::vector<std::string>& DataParallel::ignored() const { return impl_->ignored; }
const std::vector<std::string>& DataParallel::split() const { return impl_->split; }
const std::vector<std::string>& DataParallel::warnings() const { return impl_->warnings; }
double DataParallel::last_wait_seconds() const { return impl_->wait_seconds; }

int64_t DataParallel::grad_bytes() const {
  int64_t n = 0;
  for (const auto& b : impl_->bucket_infos) n += b.bytes();
  return n;
}

// The reduction runs in data_parallel.reduce_dtype when set; ZeRO's
// all-gather of the parameters in the buckets' dtype.
int64_t DataParallel::step_bytes() const {
  if (impl_->size == 1) return 0;
  int64_t n = 0;
  for (const auto& b : impl_->bucket_infos) {
    const int64_t reduced = impl_->zero ? b.padded : b.numel;
    n += reduced * impl_->wire_size(b) + (impl_->zero ? b.padded / impl_->size * b.element_size : 0);
  }
  return n + impl_->flag_bytes();
}

int64_t DataParallel::wire_bytes() const {
  int64_t n = 0;
  const int64_t d = impl_->size;
  for (const auto& b : impl_->bucket_infos)
    n += impl_->zero ? (d - 1) * b.padded * (impl_->wire_size(b) + b.element_size) / d
                     : 2 * (d - 1) * b.numel * impl_->wire_size(b) / d;
  return n + 2 * (d - 1) * impl_->flag_bytes() / d;
}

int64_t DataParallel::min_wire_bytes() const { return 2 * (impl_->size - 1) * grad_bytes() / impl_->size; }

std::string DataParallel::describe() const {
  const Impl& d = *impl_;
  std::ostringstream s;
  if (d.axis.empty()) return "data parallel: none (the plan has no batch axis)\n";
  s << "data parallel over axis '" << d.axis << "' (" << d.size << " ranks): " << d.averaged.size()
    << " parameters averaged, " << grad_bytes() << " gradient bytes in " << d.bucket_infos.size()
    << " bucket(s), overlap " << (d.overlap ? "on" : "off") << ", ZeRO " << (d.zero ? "stage " + std::to_string(d.zero) : std::string("off")) << "\n";
  for (size_t i = 0; i < d.bucket_infos.size(); ++i) {
    const auto& b = d.bucket_infos[i];
    s << "  bucket " << i << ": " << c10::toString(b.dtype) << ", " << b.params.size() << " parameters, "
      << b.numel << " elements (" << mib(b.bytes()) << "), from " << b.params.front() << " to "
      << b.params.back() << "\n";
  }
  if (!d.ignored.empty()) {
    s << "  not averaged (data_parallel.ignore):";
    for (size_t i = 0; i < d.ignored.size(); ++i) {
      s << " " << d.ignored[i];
      if (d.ignored_as[i] != d.ignored[i]) s << " (keras " << d.ignored_as[i] << ")";
    }
    s << "\n";
  }
  if (!d.split.empty()) {
    s << "  not averaged (split over '" << d.axis << "'):";
    for (const auto& p : d.split) s << " " << p;
    s << "\n";
  }
  s << "  per step on '" << d.axis << "': " << (d.zero ? "reduce-scatter + all-gather" : "all-reduce") << ", "
    << step_bytes() << " bytes handed to collectives, " << wire_bytes()
    << " bytes on the wire per rank (ring); theoretical minimum 2(D-1)/D x gradient bytes = " << min_wire_bytes()
    << "\n";
  if (d.main())
    s << "  gradients accumulate in " << c10::toString(d.main_dtype) << " in the buckets (master weights)\n";
  if (d.wire_dtype != at::ScalarType::Undefined)
    s << "  reduced in " << c10::toString(d.wire_dtype) << " (data_parallel.reduce_dtype)\n";
  return s.str();
}

// ------------------------------------------------------------ data

at::Tensor DataParallel::local_batch(const at::Tensor& global) const {
  if (impl_->size == 1) return global;
  if (global.dim() == 0 || global.size(0) % impl_->size != 0)
    throw Error("data parallel: the global batch of " + std::to_string(global.dim() ? global.size(0) : 0) +
                " samples does not divide over the " + std::to_string(impl_->size) + " ranks of batch axis '" +
                impl_->axis + "'; use a batch that is a multiple of " + std::to_string(impl_->size));
  const int64_t n = global.size(0) / impl_->size;
  return global.narrow(0, impl_->rank * n, n);
}

double DataParallel::average(double local) const { return average(std::vector<double>{local}).front(); }

std::vector<double> DataParallel::average(const std::vector<double>& local) const {
  if (impl_->size == 1 || local.empty()) return local;
  at::Tensor t = at::tensor(at::ArrayRef<double>(local), at::kDouble);
  impl_->group->all_reduce(t);
  std::vector<double> out(local.size());
  for (size_t k = 0; k < local.size(); ++k) out[k] = t[k].item<double>() / impl_->size;
  return out;
}

// ------------------------------------------------------------ step

// ZeRO: the slices of an earlier round that no step consumed yet (two
// backwards before one step) are kept aside, since the reduce-scatter
// overwrites them, and added back once this round's arrive.
void DataParallel::Impl::open_round() {
  round_open = true;
  keep_zero_unconsumed();
  keep_main_unconsumed();
}

void DataParallel::Impl::complete() {
  if (zero && !zero_attached)
    throw Error("data parallel: the plan sets data_parallel.zero: " + std::to_string(zero) + ", so step with a shardplan::Optimizer (or "
                "ZeroOptimizer) built on this DataParallel (the averaged gradients exist only as its slices)");
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!round_open) open_round();
    fill_and_launch_rest();
  }
  for (auto& b : buckets)
    if (b.work) {
      b.work->wait();
      b.work.reset();
      finish_wire(b);
    }
  const std::vector<bool> used = used_anywhere();
  wait_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(mu);
  for (auto& b : buckets) {
    if (main()) {
      // The averages stay in the buckets, for the optimizer's masters; the
      // model's .grad holds only the last backward's gradient in its dtype.
      for (size_t i : b.entries) entries[i].param.mutable_grad().reset();
      if (b.carry.defined()) (zero ? b.shard : b.flat).add_(b.carry);
      b.carry.reset();
      if (zero2()) b.flat.reset();
    } else if (!zero) {
      // .grad becomes the averaged bucket's memory (DDP's
      // gradient_as_bucket_view): nothing to copy back after the wait, and
      // the next step's NoSync micro-batches accumulate straight into it.
      // Not an autograd view of the bucket: libtorch 1.13's zero_grad()
      // detach_()es .grad, which views refuse.
      // A parameter no rank used keeps .grad as it was (undefined), as one
      // process on the global batch would: an optimizer then leaves it alone
      // rather than stepping it with zeros (Adam's moments would decay).
      for (size_t i : b.entries) {
        Entry& e = entries[i];
        if (!used[i]) continue;
        at::Tensor g = at::empty({0}, b.flat.options());
        g.set_(b.flat.storage(), b.flat.storage_offset() + e.offset, e.sizes);
        e.param.mutable_grad() = g;
      }
    } else {
      // The average lives in the slice; .grad still holds this rank's own
      // last gradient, which a later backward would otherwise add in again.
      for (size_t i : b.entries) entries[i].param.mutable_grad().reset();
      if (b.carry.defined()) {
        b.shard.add_(b.carry);
        b.carry.reset();
      }
      if (zero2()) b.flat.reset();  // no whole gradient outlives its bucket's reduction
    }
    for (size_t i : b.entries) entries[i].ready = entries[i].used = entries[i].accumulated = false;
    b.pending = b.entries.size();
    b.launched = false;
  }
  next_launch = next_drain = 0;
  to_release.clear();
  round_open = false;
  finished = true;
  release_all_units();  // ZeRO-3: nothing whole outlives a backward
  order_known = true;
  zero_unconsumed = zero;
  main_unconsumed = main() && !zero;
  if (zero || main()) {
    // The step leaves a parameter no rank used alone.
    zero_used.resize(entries.size(), false);
    for (size_t i = 0; i < entries.size(); ++i) zero_used[i] = zero_used[i] || used[i];
  }
}

void DataParallel::finish() {
  Impl& d = *impl_;
  if (d.no_sync > 0) throw Error("data parallel: finish() inside NoSync; leave the scope for the last micro-batch");
  if (d.size == 1 && !d.zero && !d.main()) return;
  if (d.finished) return;  // the end of backward did it
  d.complete();
}

DataParallel::NoSync::NoSync(DataParallel& dp) : dp_(dp) {
  std::lock_guard<std::mutex> lock(dp_.impl_->mu);
  ++dp_.impl_->no_sync;
}

DataParallel::NoSync::~NoSync() {
  std::lock_guard<std::mutex> lock(dp_.impl_->mu);
  --dp_.impl_->no_sync;
}

// ------------------------------------------------------------ consistency

void DataParallel::check_replicas() const {
  const WholeParameters whole(*this);  // ZeRO-3: compares the parameters, not this rank's slices
  const Impl& d = *impl_;
  std::vector<ReplicaAxis> axes;
  for (size_t a = 0; a < d.axis_names.size(); ++a) {
    if (d.axis_names[a] == d.pipe_axis) continue;  // the stages hold different parameters
    axes.push_back(ReplicaAxis{d.axis_names[a], d.axis_groups[a], {}});
    if (d.axis_names[a] == d.axis) axes.back().skip.insert(d.ignored.begin(), d.ignored.end());
  }
  std::vector<const ReportRow*> rows;
  for (const auto& r : d.unique_rows) rows.push_back(&r);
  check_replica_params(d.unique, rows, axes);
}

int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer) {
  int64_t n = 0;
  auto add = [&](const at::Tensor& t) {
    if (t.defined()) n += t.numel() * t.element_size();
  };
  for (const auto& kv : optimizer.state()) {
    auto* s = kv.second.get();
    if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(s)) {
      add(a->exp_avg());
      add(a->exp_avg_sq());
      add(a->max_exp_avg_sq());
    } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(s)) {
      add(w->exp_avg());
      add(w->exp_avg_sq());
      add(w->max_exp_avg_sq());
    } else if (auto* g = dynamic_cast<torch::optim::SGDParamState*>(s)) {
      add(g->momentum_buffer());
    } else if (auto* r = dynamic_cast<torch::optim::RMSpropParamState*>(s)) {
      add(r->square_avg());
      add(r->momentum_buffer());
      add(r->grad_avg());
    } else if (auto* ad = dynamic_cast<torch::optim::AdagradParamState*>(s)) {
      add(ad->sum());
    }
  }
  return n;
}

}  // namespace shardplan
