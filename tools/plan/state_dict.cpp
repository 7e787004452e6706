#include "state_dict.h"

#include <torch/serialize/input-archive.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "shardplan/checkpoint_meta.h"
#include "shardplan/error.h"

namespace shardplan_plan {
namespace {

namespace fs = std::filesystem;

StateDictShapes from_checkpoint_dir(const fs::path& dir) {
  const fs::path meta_path = dir / shardplan::ckpt::kMetaFile;
  std::ifstream in(meta_path, std::ios::binary);
  if (!in) throw shardplan::Error("cannot read '" + meta_path.string() + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const shardplan::ckpt::Meta meta = shardplan::ckpt::parse_meta(text, meta_path.string());
  StateDictShapes out;
  // Parameters carry the layout they were saved with; buffers do not. A
  // checkpoint saved without a plan has no layouts at all, and then every
  // tensor is taken.
  bool any_layout = false;
  for (const auto& t : meta.tensors) any_layout |= !t.layout.empty();
  size_t skipped_optim = 0, skipped_buffers = 0;
  for (const auto& t : meta.tensors) {
    if (t.name.rfind("optimizer/", 0) == 0) {
      ++skipped_optim;
      continue;
    }
    if (any_layout && t.layout.empty()) {
      ++skipped_buffers;
      continue;
    }
    out.params.push_back({t.name, t.shape, static_cast<int64_t>(shardplan::ckpt::dtype_bytes(t.dtype))});
  }
  if (skipped_buffers) out.notes.push_back("skipped " + std::to_string(skipped_buffers) + " buffers");
  if (skipped_optim) out.notes.push_back("skipped " + std::to_string(skipped_optim) + " optimizer state tensors");
  if (!any_layout) out.notes.push_back("the checkpoint does not mark parameters; buffers are listed too");
  return out;
}

// torch::save(module) writes each module as an archive holding its
// parameters and buffers as tensors and its children as nested archives.
void walk(torch::serialize::InputArchive& archive, const std::string& prefix, StateDictShapes& out, size_t& buffers) {
  for (const std::string& key : archive.keys()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    at::Tensor t;
    if (archive.try_read(key, t, /*is_buffer=*/false)) {
      out.params.push_back({path, t.sizes().vec(), static_cast<int64_t>(t.element_size())});
      continue;
    }
    if (archive.try_read(key, t, /*is_buffer=*/true)) {
      ++buffers;
      continue;
    }
    torch::serialize::InputArchive child;
    if (archive.try_read(key, child)) walk(child, path, out, buffers);
  }
}

StateDictShapes from_torch_file(const std::string& path) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    throw shardplan::Error("'" + path + "' is neither a sharded checkpoint directory nor a torch::save file: " + why);
  }
  StateDictShapes out;
  size_t buffers = 0;
  walk(archive, "", out, buffers);
  if (buffers) out.notes.push_back("skipped " + std::to_string(buffers) + " buffers");
  if (out.params.empty()) throw shardplan::Error("'" + path + "' holds no tensors");
  return out;
}

}  // namespace

StateDictShapes read_state_dict_shapes(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw shardplan::Error("state dict '" + path + "' not found");
  if (fs::is_directory(path, ec)) return from_checkpoint_dir(path);
  return from_torch_file(path);
}

}  // namespace shardplan_plan
