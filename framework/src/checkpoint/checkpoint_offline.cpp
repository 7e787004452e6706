// Reading a sharded checkpoint back (pieces into whole tensors, checksums
// verified) and what needs no world: offline resharding, reading whole
// tensors. load_checkpoint (checkpoint.cpp) reads through assemble too.
#include <ATen/ATen.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "checkpoint_internal.h"
#include "shardplan/checkpoint.h"
#include "shardplan/checkpoint_meta.h"
#include "shardplan/error.h"
#include "shardplan/plan.h"
#include "shardplan/shard.h"

namespace shardplan {
namespace fs = std::filesystem;

using ckpt_detail::assemble;
using ckpt_detail::rank_file;
using ckpt_detail::read_meta;
using ckpt_detail::take_splits;
using ckpt_detail::writes_piece;

namespace {

at::ScalarType dtype_of(const std::string& name) {
  static const std::map<std::string, at::ScalarType> types = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"int8", at::kChar},     {"uint8", at::kByte},     {"int16", at::kShort},  {"int32", at::kInt},
      {"int64", at::kLong},    {"bool", at::kBool}};
  return types.at(name);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The intervals of `global` along s.dim that piece s.index holds, and where
// they sit in the piece: one per block.
struct Interval {
  int64_t global_start, piece_start, len;
};
std::vector<Interval> intervals(const ckpt::DimSplit& s, int64_t global) {
  const int64_t block = global / s.blocks;
  const auto range = shard_range(block, s.parts, s.index);
  const int64_t len = range.second - range.first;
  std::vector<Interval> out;
  for (int64_t b = 0; b < s.blocks; ++b) out.push_back({b * block + range.first, b * len, len});
  return out;
}

void place(at::Tensor& full, const at::Tensor& piece, const std::vector<ckpt::DimSplit>& split, size_t i,
           at::Tensor dst, at::Tensor src) {
  if (i == split.size()) {
    dst.copy_(src);
    return;
  }
  const auto& s = split[i];
  for (const auto& iv : intervals(s, full.size(s.dim))) {
    if (iv.len == 0) continue;
    place(full, piece, split, i + 1, dst.narrow(s.dim, iv.global_start, iv.len), src.narrow(s.dim, iv.piece_start, iv.len));
  }
}

bool is_optimizer_state(const std::string& name) { return name.rfind("optimizer/", 0) == 0; }

// One rank's file of a checkpoint being written piece by piece; synced when
// closed, since the directory is only published afterwards.
class PieceFile {
 public:
  explicit PieceFile(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("create");
  }
  ~PieceFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  PieceFile(const PieceFile&) = delete;
  PieceFile& operator=(const PieceFile&) = delete;
  uint64_t append(const void* data, size_t n) {
    const uint64_t at = size_;
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        fail("write");
      }
      p += w;
      n -= static_cast<size_t>(w);
      size_ += static_cast<uint64_t>(w);
    }
    return at;
  }
  void close() {
    if (::fsync(fd_) != 0) fail("sync");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("close");
  }

 private:
  [[noreturn]] void fail(const char* what) const {
    throw Error(std::string("cannot ") + what + " '" + path_ + "': " + std::strerror(errno));
  }
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

}  // namespace

namespace ckpt_detail {

// The whole tensor from its pieces, checksums verified.
at::Tensor assemble(const ckpt::TensorEntry& e, const fs::path& dir) {
  const at::ScalarType type = dtype_of(e.dtype);
  at::Tensor full = at::empty(e.shape, at::TensorOptions().dtype(type));
  for (const auto& p : e.pieces) {
    const fs::path path = dir / p.file;
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("checkpoint file '" + path.string() + "' is missing (tensor '" + e.name + "', rank " +
                         std::to_string(p.rank) + ")");
    in.seekg(0, std::ios::end);
    const uint64_t size = static_cast<uint64_t>(in.tellg());
    if (p.offset + p.nbytes > size)
      throw Error("checkpoint file '" + path.string() + "' is truncated: tensor '" + e.name + "' needs bytes " +
                  std::to_string(p.offset) + ".." + std::to_string(p.offset + p.nbytes) + " of " +
                  std::to_string(size));
    at::Tensor piece = at::empty(p.shape, at::TensorOptions().dtype(type));
    in.seekg(static_cast<std::streamoff>(p.offset));
    in.read(static_cast<char*>(piece.data_ptr()), static_cast<std::streamsize>(p.nbytes));
    if (!in) throw Error("cannot read '" + path.string() + "'");
    if (ckpt::crc32c(piece.data_ptr(), p.nbytes) != p.crc32c)
      throw Error("checkpoint file '" + path.string() + "' is corrupted: checksum of tensor '" + e.name +
                  "' (bytes " + std::to_string(p.offset) + ".." + std::to_string(p.offset + p.nbytes) +
                  ") does not match the metadata");
    place(full, piece, p.split, 0, full, piece);
  }
  return full;
}

ckpt::Meta read_meta(const fs::path& dir) {
  const fs::path meta_path = dir / ckpt::kMetaFile;
  if (!fs::exists(meta_path))
    throw Error(fs::exists(dir) ? "'" + meta_path.string() + "' is missing: not a complete checkpoint"
                                : "no checkpoint at '" + dir.string() + "'");
  return ckpt::parse_meta(read_file(meta_path.string()), meta_path.string());
}

}  // namespace ckpt_detail

void reshard_checkpoint(const std::string& src, const std::string& dst, int world_size, const std::string& plan_yaml) {
  if (world_size < 1) throw Error("the world size must be at least 1, got " + std::to_string(world_size));
  const fs::path from = fs::absolute(src).lexically_normal();
  const fs::path target = fs::absolute(dst).lexically_normal();
  const fs::path staging = target.string() + ".partial";
  const ckpt::Meta old = read_meta(from);

  ckpt::Meta meta;
  meta.world_size = world_size;
  meta.attributes = old.attributes;
  meta.modules = old.modules;
  meta.plan = plan_yaml.empty() ? old.plan : plan_yaml;
  Mesh mesh;
  if (!meta.plan.empty()) {
    const Plan plan =
        parse_plan(meta.plan, plan_yaml.empty() ? (from / ckpt::kMetaFile).string() + " (plan)" : "--plan");
    try {
      mesh = plan.resolve_mesh(world_size);
    } catch (const Error& e) {
      // A saved mesh with fixed sizes ({data: 2, model: 2}) fits one world
      // size only: say how to name another.
      if (!plan_yaml.empty()) throw;
      throw Error(std::string(e.what()) + " (the plan saved with the checkpoint fixes its mesh; give a plan whose "
                  "mesh fits " + std::to_string(world_size) + " ranks, e.g. shardplan ckpt convert --plan PLAN.yaml "
                  "with mesh {model: auto})");
    }
    meta.plan = parse_plan(meta.plan).to_yaml();
  }
  meta.mesh = mesh.axes();

  // Cuts of every tensor, checked against the new mesh before writing anything.
  std::vector<std::vector<ShardSplit>> cuts;
  for (const auto& e : old.tensors) {
    std::vector<ShardSplit> c;
    for (const auto& s : e.pieces.front().split) {
      if (!mesh.has_axis(s.axis))
        throw Error("tensor '" + e.name + "' is split over mesh axis '" + s.axis + "', which the mesh " +
                    (mesh.ndim() ? mesh.str() : std::string("{}")) + " for " + std::to_string(world_size) +
                    " ranks does not have");
      ShardSplit x;
      x.dim = s.dim;
      x.axis = s.axis;
      x.blocks = s.blocks;
      x.parts = mesh.axis_size(s.axis);
      if (x.parts > 1) c.push_back(x);
    }
    cuts.push_back(c);
  }

  std::error_code ec;
  fs::remove_all(staging, ec);
  // A failure from here on removes what was staged, as a failed save does.
  try {
    fs::create_directories(staging);
    std::vector<std::unique_ptr<PieceFile>> files(world_size);
    for (size_t i = 0; i < old.tensors.size(); ++i) {
      const auto& e = old.tensors[i];
      const at::Tensor full = assemble(e, from);
      ckpt::TensorEntry out;
      out.name = e.name;
      out.dtype = e.dtype;
      out.shape = e.shape;
      out.layout = e.layout;
      out.buffer = e.buffer;
      for (int r = 0; r < world_size; ++r) {
        if (!writes_piece(mesh, r, cuts[i])) continue;
        std::vector<ShardSplit> mine = cuts[i];
        for (auto& s : mine) s.index = mesh.coord(r, s.axis);
        const at::Tensor t = take_splits(full, mine);
        ckpt::Piece p;
        p.rank = r;
        p.file = rank_file(r);
        if (!files[r]) files[r] = std::make_unique<PieceFile>((staging / p.file).string());
        p.nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
        p.offset = files[r]->append(t.data_ptr(), p.nbytes);
        p.shape = t.sizes().vec();
        for (const auto& s : mine) p.split.push_back(ckpt::DimSplit{s.dim, s.axis, s.parts, s.index, s.blocks});
        p.crc32c = ckpt::crc32c(t.data_ptr(), p.nbytes);
        out.pieces.push_back(p);
      }
      meta.tensors.push_back(out);
    }
    for (auto& f : files)
      if (f) f->close();
    const std::string yaml = ckpt::to_yaml(meta);
    ckpt::parse_meta(yaml, "<new metadata>");
    ckpt::write_file_atomic((staging / ckpt::kMetaFile).string(), yaml.data(), yaml.size());
    ckpt::replace_directory(staging.string(), target.string());
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
}

StateDict read_checkpoint(const std::string& dir, std::vector<std::string>* buffers,
                          std::vector<std::string>* modules) {
  const fs::path from = fs::absolute(dir).lexically_normal();
  const ckpt::Meta meta = read_meta(from);
  if (modules) *modules = meta.modules;
  StateDict out;
  for (const auto& e : meta.tensors) {
    if (is_optimizer_state(e.name)) continue;
    out.emplace_back(e.name, assemble(e, from));
    if (buffers && e.buffer) buffers->push_back(e.name);
  }
  return out;
}

}  // namespace shardplan
