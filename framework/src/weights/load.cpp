// load_weights (weights.h): match the file's tensors to the model's, check
// everything, then copy each rank's shard straight out of the mapped files.
//
// Memory: nothing is staged. All checks run on headers and shapes before the
// first parameter changes, and once they pass a copy out of a mapping cannot
// fail (short of the file being truncated under us), so "nothing changes
// unless the whole load succeeds" costs no second copy of the model. The
// copy itself is Tensor::copy_ from a strided view of the mapped bytes into
// the shard (or its rows/blocks), which converts dtypes element by element
// with no buffer of its own; a rank touches only the pages of its slice, and
// gives them back after each tensor. Under ZeRO-3 (load_weights with a
// DataParallel) a unit's parameter is copied into this rank's slice of it
// only, from the rows of the file that slice covers (load_slices.cpp).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include <map>
#include <set>

#include "base/shape_text.h"
#include "checkpoint/checkpoint_internal.h"
#include "nn/deferred_internal.h"
#include "shardplan/error.h"
#include "shardplan/nn/deferred_init.h"
#include "shardplan/shard.h"
#include "shardplan/weights.h"
#include "weights/load_slices.h"
#include "weights/rename.h"
#include "weights/weights_internal.h"

namespace shardplan {

using weights_detail::SourceTensor;

namespace {

// One tensor of the model: a tie group's names share it.
struct Target {
  std::vector<std::string> names;
  ckpt_detail::Item item;
  const SourceTensor* source = nullptr;
};

std::vector<Target> targets_of(torch::nn::Module& model, const ParallelReport& report) {
  std::vector<Target> targets;
  std::map<const void*, size_t> by_impl;  // parameters tied to one tensor
  for (auto& item : ckpt_detail::inventory(model, report)) {
    const void* impl = item.buffer ? nullptr : item.param.unsafeGetTensorImpl();
    auto it = impl ? by_impl.find(impl) : by_impl.end();
    if (it != by_impl.end()) {
      targets[it->second].names.push_back(item.name);
      continue;
    }
    if (impl) by_impl[impl] = targets.size();
    targets.push_back(Target{{item.name}, std::move(item), nullptr});
  }
  return targets;
}

std::string file_name(const SourceTensor& s) { return s.file ? s.file->path() : std::string("?"); }

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out;
}

// Gives each target its source tensor; what is left over on either side is
// missing or unexpected. A tie group takes the first of its names the file has.
void match(std::vector<Target>& targets, const std::vector<SourceTensor>& sources, const WeightsOptions& options,
           WeightsReport& rep, const std::string& path) {
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < targets.size(); ++i)
    for (const auto& n : targets[i].names) by_name.emplace(n, i);
  const weights_detail::Renames renames(options.rename);
  std::map<std::string, std::string> renamed_from;  // model name -> file name
  for (const auto& s : sources) {
    // A fused tensor's parts are named as the model names them already.
    const std::string name = s.fused_from.empty() ? renames.apply(s.name, path) : s.name;
    auto prev = renamed_from.emplace(name, weights_detail::shown_name(s));
    if (!prev.second)
      throw Error("weights '" + path + "': tensors '" + weights_detail::escaped(prev.first->second) + "' and '" +
                  weights_detail::escaped(weights_detail::shown_name(s)) + "' both become '" + weights_detail::escaped(name) +
                  "' after WeightsOptions::rename and ::fused");
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      rep.unexpected.push_back(weights_detail::shown_name(s));
      continue;
    }
    Target& t = targets[it->second];
    if (!t.source || name == t.names.front()) t.source = &s;  // the first name wins when the file has several
  }
  for (const auto& t : targets) {
    if (t.source) continue;
    if (t.item.buffer)
      rep.warnings.push_back("buffer '" + t.names.front() + "' is not in the weights; it keeps its value");
    else
      rep.missing.push_back(t.names.front());
  }
}

// The shape `splits` cut from `global`, as take_splits would give it, or
// an empty optional when a dim cannot be read as its blocks.
bool shard_shape(std::vector<int64_t> shape, const std::vector<ShardSplit>& splits, std::vector<int64_t>* out) {
  for (const auto& s : splits) {
    if (s.dim < 0 || s.dim >= static_cast<int64_t>(shape.size()) || s.blocks < 1 || shape[s.dim] % s.blocks) return false;
    if (s.parts == 1) continue;
    const auto r = shard_range(shape[s.dim] / s.blocks, s.parts, s.index);
    shape[s.dim] = s.blocks * (r.second - r.first);
  }
  *out = shape;
  return true;
}

// A ZeRO-3 parameter between uses: its shape over one element.
bool is_free(const at::Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.stride(d) == 0 && t.size(d) > 1) return true;
  return false;
}

// One line per tensor the file has with another shape than the model, or
// whose cut does not give this rank's shard shape, and per ZeRO-3 parameter
// whose slice the caller did not give (loading its free tensor would fail
// half-way).
std::vector<std::string> check_shapes(const std::vector<Target>& targets, const weights_detail::SliceTargets& slices) {
  std::vector<std::string> problems;
  for (const auto& t : targets) {
    if (!t.source) continue;
    if (!t.item.buffer && !slices.count(t.item.param.unsafeGetTensorImpl()) && is_free(t.item.local)) {
      problems.push_back("'" + t.names.front() + "' is free between uses under ZeRO-3 (its DataParallel keeps this "
                         "rank's slice of it): load with load_weights(data_parallel, model, report, path)");
      continue;
    }
    const auto& s = *t.source;
    const std::string where = "tensor '" + weights_detail::escaped(weights_detail::shown_name(s)) + "' in '" + file_name(s) + "'";
    if (s.shape != t.item.global_shape) {
      const auto& g = t.item.global_shape;
      if (!s.transposed || g.size() != 2)
        problems.push_back(where + " has shape " + shape_str(s.shape) + ", the model's '" + t.names.front() + "' is " +
                           shape_str(g));
      else  // the file's own shape, and the one it should have
        problems.push_back(where + " has shape " + shape_str({s.shape[1], s.shape[0]}) +
                           ", not the transpose of the model's '" + t.names.front() + "' " + shape_str(g) + ", " +
                           shape_str({g[1], g[0]}) + " (WeightsOptions::transposed: stored [in, out])");
      continue;
    }
    std::vector<int64_t> local;
    if (!shard_shape(s.shape, t.item.splits, &local) || local != t.item.local.sizes().vec())
      problems.push_back(where + ": this rank's cut of it does not give its shard's shape " +
                         shape_str(t.item.local.sizes()));
    const auto dt = t.item.local.scalar_type();
    if (!at::isFloatingType(dt) && !at::isIntegralType(dt, /*includeBool=*/true))
      problems.push_back("'" + t.names.front() + "' has dtype " + c10::toString(dt) + ", which weights cannot fill");
  }
  return problems;
}

int64_t copy_one(const Target& t, const WeightsOptions& options) {
  const SourceTensor& s = *t.source;
  at::Tensor src = s.view();
  at::Tensor dst = t.item.local;  // shares the parameter's storage
  if (!options.whole_then_slice && weights_detail::views_express(t.item.splits)) {
    weights_detail::copy_rows(dst, src, t.item.splits, 0, dst.dim() ? dst.size(0) : 0, s.is_bool);
  } else {
    // A later split of a dim an earlier blocked split cut reads the blocks
    // put together (take_split's order), which views cannot express; that
    // case (no plugin makes it) takes the shard through take_splits.
    if (s.is_bool) src = src.ne(0);  // any nonzero byte is true, as in safetensors
    dst.copy_(ckpt_detail::take_splits(options.whole_then_slice ? src.clone() : src, t.item.splits));
  }
  s.file->drop(s.begin, s.end);
  return dst.numel() * dst.element_size();
}

// A model built under DeferredInit has no values but the file's: a
// parameter the file lacks would keep zeros nobody chose, so even a lenient
// load refuses to leave one out.
void refuse_unfilled(const std::vector<Target>& targets, const std::string& path) {
  std::vector<std::string> unfilled;
  for (const auto& t : targets)
    if (!t.source && !t.item.buffer && nn::is_deferred(t.item.param)) unfilled.push_back(t.names.front());
  if (!unfilled.empty())
    throw Error("weights '" + path + "' lack " + std::to_string(unfilled.size()) +
                " parameter(s) of a model built under DeferredInit, which would keep no values: " + joined(unfilled) +
                "; build the model without DeferredInit to keep their initial values");
}

// Every ZeRO-3 slice given belongs to a parameter of this model (a
// DataParallel of another model would keep its old values unnoticed).
void check_slices_belong(const std::vector<Target>& targets, const weights_detail::SliceTargets& slices,
                         const std::string& path) {
  size_t found = 0;
  for (const auto& t : targets)
    if (!t.item.buffer && slices.count(t.item.param.unsafeGetTensorImpl())) ++found;
  if (found != slices.size())
    throw Error("weights '" + path + "': the DataParallel given to load_weights holds " +
                std::to_string(slices.size() - found) + " ZeRO-3 parameter(s) this model lacks: it was made over "
                "another model");
}

}  // namespace

WeightsReport load_weights(torch::nn::Module& model, const ParallelReport& report, const std::string& path,
                           const WeightsOptions& options) {
  return weights_detail::load_into(model, report, path, options, {});
}

WeightsReport weights_detail::load_into(torch::nn::Module& model, const ParallelReport& report,
                                        const std::string& path, const WeightsOptions& options,
                                        const SliceTargets& slices) {
  std::vector<SourceTensor> sources = weights_detail::open_weights(path);
  weights_detail::transpose_sources(sources, options.transposed, path);
  sources = weights_detail::split_fused(std::move(sources), options.fused);
  std::vector<Target> targets = targets_of(model, report);
  check_slices_belong(targets, slices, path);
  WeightsReport rep;
  match(targets, sources, options, rep, path);
  if (options.strict && (!rep.missing.empty() || !rep.unexpected.empty())) {
    std::string msg = "weights '" + path + "' do not match the model:";
    if (!rep.missing.empty())
      msg += " " + std::to_string(rep.missing.size()) + " parameter(s) missing from the file: " + joined(rep.missing) + ";";
    if (!rep.unexpected.empty())
      msg += " " + std::to_string(rep.unexpected.size()) + " tensor(s) in the file the model lacks: " +
             joined(rep.unexpected) + ";";
    throw Error(msg + " map names with WeightsOptions::rename, or load with strict = false");
  }
  for (const auto& m : rep.missing) rep.warnings.push_back("parameter '" + m + "' is not in the weights; it keeps its value");
  for (const auto& u : rep.unexpected) rep.warnings.push_back("tensor '" + weights_detail::escaped(u) + "' of the weights is not in the model");
  const auto problems = check_shapes(targets, slices);
  if (!problems.empty()) {
    std::string msg = "weights '" + path + "': ";
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    throw Error(msg);
  }
  refuse_unfilled(targets, path);
  // Parameters still over the zero page (those kept whole, and TP shards
  // outside ZeRO-3's slices) get theirs now, after every check passed. Their
  // tensors change storage, so the targets' views of them are taken again.
  if (!nn::detail::give_memory(model, /*zero=*/false).empty()) {
    targets = targets_of(model, report);
    WeightsReport again;
    match(targets, sources, options, again, path);
  }
  at::NoGradGuard no_grad;
  for (const auto& t : targets) {
    if (!t.source) continue;
    const auto slice = t.item.buffer ? slices.end() : slices.find(t.item.param.unsafeGetTensorImpl());
    rep.bytes_copied += slice == slices.end() ? copy_one(t, options)
                                              : weights_detail::copy_into_slice(*t.source, t.item.splits,
                                                                                t.item.local.sizes(), slice->second,
                                                                                options.whole_then_slice);
    rep.loaded.push_back(t.names.front());
    if (!t.item.buffer) nn::detail::mark_filled(t.item.param);
  }
  return rep;
}

}  // namespace shardplan
