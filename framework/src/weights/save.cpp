// Writing safetensors (weights.h): the whole tensors under their original
// names, one file or Hugging Face's shards + index, streamed one tensor at
// a time so a model never has to be whole in memory.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "checkpoint/checkpoint_internal.h"
#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/weights.h"
#include "shardplan/world.h"
#include "weights/safetensors_header.h"
#include "weights/weights_internal.h"

namespace shardplan {

namespace fs = std::filesystem;
using weights_detail::SafetensorsEntry;

namespace {

// Gives tensor i, whole and contiguous; every rank calls it for every i in
// order (gathering is collective), and only the writing rank uses the result.
using Produce = std::function<at::Tensor(size_t)>;

SafetensorsEntry entry_of(const std::string& name, at::ScalarType dtype, const std::vector<int64_t>& shape) {
  SafetensorsEntry e;
  e.name = name;
  e.dtype = weights_detail::safetensors_dtype_of(dtype);
  e.element_size = weights_detail::safetensors_dtype_size(e.dtype);
  e.shape = shape;
  return e;
}

uint64_t bytes_of(const SafetensorsEntry& e) {
  uint64_t n = static_cast<uint64_t>(e.element_size);
  for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
  return n;
}

// One file: header, then each tensor's bytes, beside the target, then renamed.
void write_file(const fs::path& target, std::vector<SafetensorsEntry> entries, const std::vector<size_t>& which,
                const Produce& produce, bool writes, std::string& error) {
  const std::string header = weights_detail::safetensors_header_json(entries, {{"format", "pt"}});
  const fs::path tmp = target.string() + ".partial";
  std::ofstream out;
  if (writes && error.empty()) {
    out.open(tmp, std::ios::binary | std::ios::trunc);
    if (!out) error = "cannot write '" + tmp.string() + "'";
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8).write(header.data(), static_cast<std::streamsize>(header.size()));
  }
  for (size_t k = 0; k < which.size(); ++k) {
    const at::Tensor t = produce(which[k]);
    if (!writes || !error.empty()) continue;
    const at::Tensor c = t.contiguous();
    if (c.numel() * c.element_size() != static_cast<int64_t>(entries[k].end - entries[k].begin))
      error = "tensor '" + entries[k].name + "' changed size while being saved";
    else
      out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(entries[k].end - entries[k].begin));
  }
  if (!writes || !error.empty()) return;
  out.close();
  if (!out) {
    error = "writing '" + tmp.string() + "' failed (disk full?)";
    return;
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) error = "cannot rename '" + tmp.string() + "' to '" + target.string() + "': " + ec.message();
}

// Lays `entries` out as path's file(s); returns the error the writer met, or "".
std::string write_all(const std::string& path, const std::vector<SafetensorsEntry>& entries, const Produce& produce,
                      bool writes, const SaveWeightsOptions& options) {
  std::string error;
  std::vector<std::vector<size_t>> groups(1);
  uint64_t in_group = 0, total = 0;
  const bool one_file = path.size() >= 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const uint64_t n = bytes_of(entries[i]);
    if (!one_file && !groups.back().empty() && in_group + n > static_cast<uint64_t>(options.max_file_bytes)) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(i);
    in_group += n;
    total += n;
  }
  const fs::path dir = one_file ? fs::path(path).parent_path() : fs::path(path);
  if (writes) {
    std::error_code ec;
    if (!dir.empty()) fs::create_directories(dir, ec);
    if (ec) error = "cannot create '" + dir.string() + "': " + ec.message();
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t g = 0; g < groups.size(); ++g) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", g + 1, groups.size());
    const fs::path target = one_file ? fs::path(path) : groups.size() == 1 ? dir / "model.safetensors" : dir / name;
    std::vector<SafetensorsEntry> part;
    for (size_t i : groups[g]) {
      part.push_back(entries[i]);
      weight_map[entries[i].name] = target.filename().string();
    }
    write_file(target, part, groups[g], produce, writes, error);
  }
  if (!writes || !error.empty() || one_file) return error;
  // A directory holds one layout: the index, if any, says which files count.
  std::error_code ec;
  if (groups.size() == 1) {
    fs::remove(dir / "model.safetensors.index.json", ec);
    return error;
  }
  fs::remove(dir / "model.safetensors", ec);
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const fs::path tmp = dir / "model.safetensors.index.json.partial";
  std::ofstream out(tmp);
  out << index.dump(2) << "\n";
  out.close();
  if (!out) return "cannot write '" + tmp.string() + "'";
  fs::rename(tmp, dir / "model.safetensors.index.json", ec);
  return ec ? "cannot rename '" + tmp.string() + "': " + ec.message() : "";
}

// Swaps the entries SaveWeightsOptions::transposed names to [in, out];
// returns which. Throws Error for a matched tensor that is not 2-D.
std::vector<bool> transpose_entries(std::vector<SafetensorsEntry>& entries, const SaveWeightsOptions& options) {
  std::vector<bool> out(entries.size(), false);
  if (options.transposed.empty()) return out;
  const weights_detail::TransposedNames names(options.transposed);
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string* pattern = names.match(entries[i].name);
    if (!pattern) continue;
    auto& shape = entries[i].shape;
    if (shape.size() != 2)
      throw Error("save weights: tensor '" + entries[i].name + "' has " + std::to_string(shape.size()) +
                  " dims, but SaveWeightsOptions::transposed '" + *pattern +
                  "' names it: only a 2-D tensor is written transposed");
    std::swap(shape[0], shape[1]);
    out[i] = true;
  }
  return out;
}

// What is written: one model tensor, or a SaveWeightsOptions::fused entry's
// parameters concatenated along dim 0 under its name.
struct WrittenTensor {
  std::string name;
  std::vector<size_t> items;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
};

constexpr size_t kMaxFused = 100000, kMaxFusedParts = 64;

// Every rank computes the same layout, so a refusal throws on all of them
// before the first collective gather.
std::vector<WrittenTensor> fused_layout(const std::vector<ckpt_detail::Item>& items, const SaveWeightsOptions& options) {
  const auto& fused = options.fused;
  if (fused.size() > kMaxFused)
    throw Error("SaveWeightsOptions::fused has " + std::to_string(fused.size()) + " entries (at most 100000)");
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < items.size(); ++i) index.emplace(items[i].name, i);
  std::vector<int64_t> group_of(items.size(), -1);
  for (size_t g = 0; g < fused.size(); ++g) {
    const std::string what = "SaveWeightsOptions::fused '" + fused[g].first + "'";
    if (fused[g].first.empty() || fused[g].second.empty() || fused[g].second.size() > kMaxFusedParts)
      throw Error(what + ": needs a name and 1 to 64 parameters");
    const ckpt_detail::Item* first = nullptr;
    for (const auto& part : fused[g].second) {
      const auto it = index.find(part);
      if (it == index.end() || items[it->second].buffer)
        throw Error(what + ": the model has no parameter '" + part + "' to write (a tied one only under its first name)");
      const auto& item = items[it->second];
      if (group_of[it->second] >= 0) throw Error(what + ": '" + part + "' is fused twice");
      group_of[it->second] = static_cast<int64_t>(g);
      if (!first) first = &item;
      const auto& a = first->global_shape;
      const auto& b = item.global_shape;
      if (b.empty() || a.size() != b.size() || !std::equal(a.begin() + 1, a.end(), b.begin() + 1) ||
          item.local.scalar_type() != first->local.scalar_type())
        throw Error(what + ": '" + part + "' does not stack on '" + first->name +
                    "' along dim 0 (another dtype, or other sizes past dim 0)");
    }
  }
  std::vector<WrittenTensor> out;
  std::set<std::string> names;
  std::vector<bool> emitted(fused.size(), false);
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& item = items[i];
    WrittenTensor w{item.name, {i}, item.global_shape, item.local.scalar_type()};
    if (group_of[i] >= 0) {
      const auto& entry = fused[static_cast<size_t>(group_of[i])];
      w.name = entry.first;
      w.items.clear();
      w.shape[0] = 0;
      for (const auto& part : entry.second) {
        w.items.push_back(index.at(part));
        w.shape[0] += items[index.at(part)].global_shape[0];
      }
      if (emitted[static_cast<size_t>(group_of[i])]) continue;  // written where its first parameter stood
      emitted[static_cast<size_t>(group_of[i])] = true;
    }
    if (!names.insert(w.name).second)
      throw Error("SaveWeightsOptions::fused: '" + w.name + "' would be written twice (a fused entry named as a model tensor)");
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace

void save_weights_safetensors(torch::nn::Module& model, const ParallelReport& report, World& world,
                              const std::string& path, const SaveWeightsOptions& options) {
  at::NoGradGuard no_grad;
  std::vector<ckpt_detail::Item> items;
  std::vector<const void*> seen;  // a tied tensor is written once, under its first name
  for (auto& item : ckpt_detail::inventory(model, report)) {
    const void* impl = item.buffer ? nullptr : item.param.unsafeGetTensorImpl();
    if (impl && std::find(seen.begin(), seen.end(), impl) != seen.end()) continue;
    seen.push_back(impl);
    items.push_back(std::move(item));
  }
  const std::vector<WrittenTensor> written = fused_layout(items, options);
  std::vector<SafetensorsEntry> entries;
  for (const auto& w : written) entries.push_back(entry_of(w.name, w.dtype, w.shape));
  const std::vector<bool> transposed = transpose_entries(entries, options);  // the same on every rank
  const bool writes = world.rank() == options.root;
  const Produce produce = [&](size_t i) {
    const WrittenTensor& w = written[i];
    at::Tensor out;
    if (w.items.size() == 1) {
      out = ckpt_detail::gather_whole(items[w.items[0]], items[w.items[0]].local, report, world);
    } else {
      // A fused tensor is filled part by part: beside it, one part is whole.
      if (writes) out = at::empty(w.shape, at::TensorOptions().dtype(w.dtype));
      int64_t row = 0;
      for (size_t k : w.items) {
        const at::Tensor part = ckpt_detail::gather_whole(items[k], items[k].local, report, world);
        if (writes) out.narrow(0, row, part.size(0)).copy_(part);
        row += items[k].global_shape[0];
      }
    }
    return transposed[i] && out.defined() ? out.t() : out;
  };
  const std::string error = write_all(path, entries, produce, writes, options);
  // Every rank learns whether the writer failed, so none returns as if saved.
  at::Tensor failed = at::full({1}, error.empty() ? 0 : 1, at::kInt);
  world.comm().all_reduce(failed, ReduceOp::Max);
  if (!error.empty()) throw Error("save_weights_safetensors: " + error);
  if (failed.item<int>() != 0)
    throw Error("save_weights_safetensors: rank " + std::to_string(options.root) + " could not write '" + path + "'");
}

void write_safetensors(const std::string& path, const StateDict& tensors, const SaveWeightsOptions& options) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& kv : tensors) entries.push_back(entry_of(kv.first, kv.second.scalar_type(), kv.second.sizes().vec()));
  const std::vector<bool> transposed = transpose_entries(entries, options);
  const std::string error = write_all(
      path, entries, [&](size_t i) { return transposed[i] ? tensors[i].second.t() : tensors[i].second; }, true, options);
  if (!error.empty()) throw Error("write_safetensors: " + error);
}

StateDict read_weights(const std::string& path) {
  StateDict out;
  for (const auto& s : weights_detail::open_weights(path)) {
    at::Tensor t = s.view().clone();
    out.emplace_back(s.name, s.is_bool ? t.ne(0) : t);
  }
  return out;
}

}  // namespace shardplan
