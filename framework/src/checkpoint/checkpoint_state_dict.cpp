// State dicts without files: a model's tensors by name, gathered whole over
// the mesh (collect; the gradients too), cut to this rank's pieces
// (relocate), copied in (load).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include <map>
#include <string>
#include <vector>

#include "base/shape_text.h"
#include "checkpoint_internal.h"
#include "shardplan/checkpoint.h"
#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"

namespace shardplan {

using ckpt_detail::inventory;
using ckpt_detail::rows_by_path;
using ckpt_detail::take_splits;

namespace {

// Inverse of take_split over one axis group: every member's piece, padded to
// the largest chunk for the all-gather, trimmed and put back block by block.
at::Tensor gather_split(const at::Tensor& local, const ShardSplit& s, int64_t global_dim_size, Communicator& group) {
  if (s.parts == 1) return local;
  const int64_t block = global_dim_size / s.blocks;
  const int64_t chunk = (block + s.parts - 1) / s.parts;
  std::vector<int64_t> sizes = local.sizes().vec();
  // [.., blocks * len, ..] -> [.., blocks, len, ..]
  std::vector<int64_t> blocked(sizes.begin(), sizes.begin() + s.dim);
  blocked.push_back(s.blocks);
  blocked.push_back(sizes[s.dim] / s.blocks);
  blocked.insert(blocked.end(), sizes.begin() + s.dim + 1, sizes.end());
  at::Tensor piece = local.contiguous().view(blocked);
  const int64_t len = blocked[s.dim + 1];
  if (len < chunk) {
    std::vector<int64_t> pad_shape = blocked;
    pad_shape[s.dim + 1] = chunk - len;
    piece = at::cat({piece, at::zeros(pad_shape, piece.options())}, s.dim + 1);
  }
  // [parts * shared, .., blocks, chunk, ..]: the first holder of each piece
  // gives it (ranks sharing a piece hold equal copies).
  at::Tensor all = group.all_gather(piece.unsqueeze(0).contiguous(), 0);
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < s.parts; ++r) {
    const auto range = shard_range(block, s.parts, r);
    parts.push_back(all[r * s.shared].narrow(s.dim + 1, 0, range.second - range.first));
  }
  at::Tensor joined = at::cat(parts, s.dim + 1);  // [.., blocks, block, ..]
  std::vector<int64_t> out = sizes;
  out[s.dim] = global_dim_size;
  return joined.reshape(out);
}

}  // namespace

namespace ckpt_detail {

at::Tensor gather_whole(const Item& item, const at::Tensor& local, const ParallelReport& report, World& world) {
  at::Tensor t = local;
  for (auto s = item.splits.rbegin(); s != item.splits.rend(); ++s)
    t = gather_split(t, *s, item.global_shape[s->dim], *world.group(report.mesh, s->axis));
  return t;
}

}  // namespace ckpt_detail

StateDict local_state_dict(torch::nn::Module& model) {
  StateDict out;
  for (const auto& p : model.named_parameters()) out.emplace_back(p.key(), p.value().detach());
  for (const auto& b : model.named_buffers()) out.emplace_back(b.key(), b.value().detach());
  return out;
}

namespace {

StateDict collect_items(const std::vector<ckpt_detail::Item>& items, const ParallelReport& report, World& world,
                        int root) {
  at::NoGradGuard no_grad;
  StateDict out;
  for (const auto& item : items) {
    at::Tensor t = ckpt_detail::gather_whole(item, item.local, report, world);
    if (root < 0 || world.rank() == root) out.emplace_back(item.name, t.contiguous());
  }
  return out;
}

}  // namespace

StateDict collect_state_dict(torch::nn::Module& model, const ParallelReport& report, World& world, int root) {
  return collect_items(inventory(model, report), report, world, root);
}

StateDict collect_state_dict(const StateDict& local, const ParallelReport& report, World& world, int root) {
  const auto rows = rows_by_path(report);
  std::vector<ckpt_detail::Item> items;
  for (const auto& [name, t] : local) {
    ckpt_detail::Item it{name, t.detach(), t, t.sizes().vec(), {}, "", false, at::Tensor()};
    auto r = rows.find(name);
    if (r != rows.end() && !r->second->splits.empty()) {
      it.global_shape = r->second->global_shape;
      it.splits = r->second->splits;
    }
    items.push_back(std::move(it));
  }
  return collect_items(items, report, world, root);
}

namespace ckpt_detail {

StateDict collect_gradients(std::vector<Item> items, const ParallelReport& report, World& world, int root) {
  at::NoGradGuard no_grad;
  std::vector<Item> params;
  for (auto& item : items)
    if (!item.buffer) params.push_back(std::move(item));
  // Every rank must gather the same tensors, and a parameter no rank gave a
  // gradient stays out, as its .grad stays undefined in one process; a rank
  // without one where others have it contributes zeros (it did not use it).
  at::Tensor has = at::zeros({static_cast<int64_t>(params.size())}, at::kInt);
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].param.grad().defined()) has[static_cast<int64_t>(i)] = 1;
  world.comm().all_reduce(has, ReduceOp::Max);
  StateDict out;
  for (size_t i = 0; i < params.size(); ++i) {
    if (has[static_cast<int64_t>(i)].item<int>() == 0) continue;
    const auto& item = params[i];
    at::Tensor g = item.param.grad();
    at::Tensor t = gather_whole(item, g.defined() ? g.detach() : at::zeros_like(item.local), report, world);
    // A whole one would otherwise be the .grad itself, which the next
    // zero_grad and backward overwrite.
    if (root < 0 || world.rank() == root) out.emplace_back(item.name, item.splits.empty() ? t.clone() : t.contiguous());
  }
  return out;
}

}  // namespace ckpt_detail

StateDict collect_gradients(torch::nn::Module& model, const ParallelReport& report, World& world, int root) {
  return ckpt_detail::collect_gradients(inventory(model, report), report, world, root);
}

StateDict relocate_state_dict(const StateDict& full, const ParallelReport& report) {
  const auto rows = rows_by_path(report);
  StateDict out;
  for (const auto& kv : full) {
    auto r = rows.find(kv.first);
    if (r == rows.end() || r->second->splits.empty()) {
      out.push_back(kv);
      continue;
    }
    const ReportRow& row = *r->second;
    if (kv.second.sizes().vec() != row.global_shape)
      throw Error("state dict: '" + kv.first + "' has shape " + shape_str(kv.second.sizes()) +
                  ", the model's is " + shape_str(row.global_shape));
    out.emplace_back(kv.first, take_splits(kv.second, row.splits));
  }
  return out;
}

void load_state_dict(torch::nn::Module& model, const StateDict& state) {
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  at::NoGradGuard no_grad;
  auto copy = [&](const std::string& name, at::Tensor& dst) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw Error("state dict has no '" + name + "'");
    if (it->second.sizes() != dst.sizes())
      throw Error("state dict: '" + name + "' has shape " + shape_str(it->second.sizes()) + ", the model's is " +
                  shape_str(dst.sizes()));
    dst.copy_(it->second);
  };
  for (auto& p : model.named_parameters()) copy(p.key(), p.value());
  for (auto& b : model.named_buffers()) copy(b.key(), b.value());
}

}  // namespace shardplan
