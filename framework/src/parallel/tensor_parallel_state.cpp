// TensorParallel's state_dict: the full tensors gathered from the ranks'
// shards through the shard maps (ParamSlot), scattered back on load, and
// Module::save's archive layout for the plain model.
#include <torch/torch.h>

#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "base/shape_text.h"
#include "shardplan/error.h"
#include "tensor_parallel_internal.h"

namespace shardplan {

using tp_detail::find_named;

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
