#include "shardplan/checkpoint_meta.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <type_traits>

#include "shardplan/error.h"
#include "base/utf8.h"

namespace shardplan {
namespace ckpt {

namespace fs = std::filesystem;

const TensorEntry* Meta::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

size_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"float32", 4}, {"float64", 8}, {"float16", 2}, {"bfloat16", 2}, {"int8", 1},
      {"uint8", 1},   {"int16", 2},   {"int32", 4},   {"int64", 8},    {"bool", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

namespace {

[[noreturn]] void sys_fail(const std::string& what, const std::string& path) {
  throw Error("cannot " + what + " '" + path + "': " + std::strerror(errno));
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) sys_fail("open directory", dir);
  // Some filesystems refuse fsync on a directory (EINVAL); the rename is then
  // as durable as they make it.
  if (::fsync(fd) != 0 && errno != EINVAL) {
    int saved = errno;
    ::close(fd);
    errno = saved;
    sys_fail("sync directory", dir);
  }
  ::close(fd);
}

}  // namespace

void write_file_atomic(const std::string& path, const void* data, size_t n) {
  const fs::path target(path);
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
  std::string tmp = (fs::path(dir) / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) sys_fail("create a temporary file for", path);
  auto fail = [&](const std::string& what) {
    int saved = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    errno = saved;
    sys_fail(what, path);
  };
  const char* p = static_cast<const char*>(data);
  size_t left = n;
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("write");  // ENOSPC lands here: the old file stays as it was
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  if (::fchmod(fd, 0644) != 0) fail("set permissions of");
  if (::fsync(fd) != 0) fail("sync");
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    sys_fail("close", path);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int saved = errno;
    ::unlink(tmp.c_str());
    errno = saved;
    sys_fail("rename into place", path);
  }
  fsync_dir(dir);
}

void replace_directory(const std::string& from, const std::string& to) {
  std::error_code ec;
  if (fs::exists(to, ec)) {
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) != 0)
      sys_fail("swap in the new checkpoint directory at", to);
    fs::remove_all(from, ec);  // the old one; a leftover is harmless
  } else if (::rename(from.c_str(), to.c_str()) != 0) {
    sys_fail("move the new checkpoint directory to", to);
  }
  const fs::path parent = fs::path(to).parent_path();
  fsync_dir(parent.empty() ? "." : parent.string());
}

// ------------------------------------------------------------------ YAML out

namespace {

void emit_ints(YAML::Emitter& out, const std::vector<int64_t>& v) {
  out << YAML::Flow << YAML::BeginSeq;
  for (int64_t x : v) out << x;
  out << YAML::EndSeq;
}

}  // namespace

namespace {

// Whether `text` can be written as YAML's plain or literal form and read
// back unchanged: printable ASCII (and line breaks where `lines`), not
// starting with a space or, for a literal block, a line break (either would
// be read as indentation), and for a literal block ending in exactly one line
// break, which is what its default chomping gives back. Anything else (a NUL
// byte, a control character, no final line break) is written double-quoted,
// where YAML escapes it.
bool plainly_writable(const std::string& text, bool lines) {
  if (text.empty()) return true;
  if (text[0] == ' ' || (lines && text[0] == '\n')) return false;
  if (lines && (text.back() != '\n' || (text.size() > 1 && text[text.size() - 2] == '\n'))) return false;
  return std::all_of(text.begin(), text.end(), [lines](unsigned char ch) {
    return (ch >= 0x20 && ch < 0x7f) || (lines && ch == '\n');
  });
}

}  // namespace

std::string to_yaml(const Meta& meta) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "format_version" << YAML::Value << meta.format_version;
  out << YAML::Key << "world_size" << YAML::Value << meta.world_size;
  out << YAML::Key << "mesh" << YAML::Value << YAML::Flow << YAML::BeginMap;
  for (const auto& a : meta.mesh) out << YAML::Key << a.first << YAML::Value << a.second;
  out << YAML::EndMap;
  out << YAML::Key << "attributes" << YAML::Value << YAML::BeginMap;
  for (const auto& kv : meta.attributes) {
    out << YAML::Key;
    if (!plainly_writable(kv.first, false)) out << YAML::DoubleQuoted;
    out << kv.first << YAML::Value << YAML::DoubleQuoted << kv.second;
  }
  out << YAML::EndMap;
  out << YAML::Key << "plan" << YAML::Value << (plainly_writable(meta.plan, true) ? YAML::Literal : YAML::DoubleQuoted)
      << meta.plan;
  if (!meta.modules.empty()) {
    out << YAML::Key << "modules" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const auto& m : meta.modules) out << YAML::DoubleQuoted << m;
    out << YAML::EndSeq;
  }
  out << YAML::Key << "tensors" << YAML::Value << YAML::BeginSeq;
  for (const auto& t : meta.tensors) {
    out << YAML::BeginMap;
    out << YAML::Key << "name" << YAML::Value << YAML::DoubleQuoted << t.name;
    out << YAML::Key << "dtype" << YAML::Value << t.dtype;
    out << YAML::Key << "shape" << YAML::Value;
    emit_ints(out, t.shape);
    out << YAML::Key << "layout" << YAML::Value << YAML::DoubleQuoted << t.layout;
    if (t.buffer) out << YAML::Key << "buffer" << YAML::Value << true;
    out << YAML::Key << "pieces" << YAML::Value << YAML::BeginSeq;
    for (const auto& p : t.pieces) {
      out << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "rank" << YAML::Value << p.rank;
      out << YAML::Key << "file" << YAML::Value << p.file;
      out << YAML::Key << "offset" << YAML::Value << p.offset;
      out << YAML::Key << "nbytes" << YAML::Value << p.nbytes;
      out << YAML::Key << "shape" << YAML::Value;
      emit_ints(out, p.shape);
      out << YAML::Key << "split" << YAML::Value << YAML::BeginSeq;
      for (const auto& s : p.split) {
        out << YAML::Flow << YAML::BeginMap << YAML::Key << "dim" << YAML::Value << s.dim << YAML::Key << "axis"
            << YAML::Value << s.axis << YAML::Key << "parts" << YAML::Value << s.parts << YAML::Key << "index"
            << YAML::Value << s.index << YAML::Key << "blocks" << YAML::Value << s.blocks;
        if (s.shared > 1) out << YAML::Key << "shared" << YAML::Value << s.shared;
        out << YAML::EndMap;
      }
      out << YAML::EndSeq;
      out << YAML::Key << "crc32c" << YAML::Value << YAML::Hex << p.crc32c << YAML::Dec;
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

// ------------------------------------------------------------------- YAML in

namespace {

using detail::valid_utf8;

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const YAML::Node& at, const std::string& msg) const {
    const YAML::Mark m = at.Mark();
    SourceLoc loc{source_, m.line < 0 ? 0 : m.line + 1, m.column < 0 ? 0 : m.column + 1};
    throw PlanError(loc, msg);
  }

  YAML::Node need(const YAML::Node& map, const char* key, YAML::NodeType::value type) const {
    if (!map.IsMap()) fail(map, "expected a mapping");
    YAML::Node v = map[key];
    if (!v) fail(map, std::string("missing '") + key + "'");
    if (v.Type() != type) fail(v, std::string("'") + key + "' has the wrong type");
    return v;
  }

  template <class T>
  T scalar(const YAML::Node& map, const char* key) const {
    YAML::Node v = need(map, key, YAML::NodeType::Scalar);
    if constexpr (std::is_same_v<T, std::string>) return text(v, std::string("'") + key + "'");
    try {
      return v.as<T>();
    } catch (const YAML::Exception&) {
      fail(v, std::string("'") + key + "' is not a valid value: '" + v.Scalar() + "'");
    }
  }

  // A scalar's text, which must be UTF-8; `what` names it in the error.
  std::string text(const YAML::Node& v, const std::string& what) const {
    if (!v.IsScalar()) fail(v, what + " must be a scalar");
    if (!valid_utf8(v.Scalar())) fail(v, what + " is not valid UTF-8");
    return v.Scalar();
  }

  int64_t dim_value(const YAML::Node& v, int64_t lo) const {
    int64_t x = 0;
    try {
      x = v.as<int64_t>();
    } catch (const YAML::Exception&) {
      fail(v, "expected an integer, got '" + (v.IsScalar() ? v.Scalar() : std::string("?")) + "'");
    }
    if (x < lo) fail(v, "value " + std::to_string(x) + " is below " + std::to_string(lo));
    return x;
  }

  std::vector<int64_t> ints(const YAML::Node& map, const char* key, int64_t lo) const {
    YAML::Node v = need(map, key, YAML::NodeType::Sequence);
    std::vector<int64_t> out;
    for (const auto& x : v) {
      if (!x.IsScalar()) fail(x, std::string("'") + key + "' must list integers");
      out.push_back(dim_value(x, lo));
    }
    return out;
  }

  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

// shard_range's ceil chunks (shard.h), repeated here to keep this file
// torch-free for the metadata fuzzer.
int64_t chunk_len(int64_t size, int64_t parts, int64_t index) {
  const int64_t c = (size + parts - 1) / parts;
  return std::max<int64_t>(0, std::min(size, (index + 1) * c) - std::min(size, index * c));
}

// Elements of `shape`, or nullopt on overflow past 2^62.
std::optional<uint64_t> numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > (uint64_t{1} << 62) / static_cast<uint64_t>(d)) return std::nullopt;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

}  // namespace

Meta parse_meta(const std::string& text, const std::string& source, bool complete) {
  Reader r(source);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    SourceLoc loc{source, e.mark.line < 0 ? 0 : e.mark.line + 1, e.mark.column < 0 ? 0 : e.mark.column + 1};
    throw PlanError(loc, "not valid YAML: " + e.msg);
  }
  if (!root.IsMap()) r.fail(root, "a checkpoint's metadata must be a mapping");
  Meta meta;
  meta.format_version = r.scalar<int>(root, "format_version");
  if (meta.format_version != kFormatVersion)
    r.fail(root["format_version"], "format version " + std::to_string(meta.format_version) +
                                       " is not supported (this shardplan reads version " +
                                       std::to_string(kFormatVersion) + ")");
  meta.world_size = r.scalar<int>(root, "world_size");
  if (meta.world_size < 1) r.fail(root["world_size"], "world_size must be at least 1");
  {
    YAML::Node mesh = r.need(root, "mesh", YAML::NodeType::Map);
    int64_t product = 1;
    for (const auto& kv : mesh) {
      const int size = static_cast<int>(r.dim_value(kv.second, 1));
      if (size > meta.world_size) r.fail(kv.second, "axis larger than the world");
      meta.mesh.emplace_back(r.text(kv.first, "a mesh axis name"), size);
      product *= size;
    }
    if (complete && !meta.mesh.empty() && product != meta.world_size)
      r.fail(mesh, "mesh sizes multiply to " + std::to_string(product) + ", not world_size " +
                       std::to_string(meta.world_size));
  }
  if (YAML::Node attrs = root["attributes"]) {
    if (!attrs.IsMap()) r.fail(attrs, "'attributes' must be a mapping");
    for (const auto& kv : attrs) {
      if (!kv.second.IsScalar()) r.fail(kv.second, "attribute values must be scalars");
      meta.attributes[r.text(kv.first, "an attribute name")] = r.text(kv.second, "an attribute value");
    }
  }
  if (YAML::Node plan = root["plan"]) {
    if (!plan.IsScalar()) r.fail(plan, "'plan' must be the plan's text");
    meta.plan = r.text(plan, "'plan'");
  }
  if (YAML::Node modules = root["modules"]) {
    if (!modules.IsSequence()) r.fail(modules, "'modules' must list module paths");
    for (const auto& m : modules) {
      if (!m.IsScalar() || m.Scalar().empty()) r.fail(m, "'modules' must list module paths");
      meta.modules.push_back(r.text(m, "a module path"));
    }
  }
  std::set<std::string> names;
  for (const auto& tn : r.need(root, "tensors", YAML::NodeType::Sequence)) {
    TensorEntry t;
    t.name = r.scalar<std::string>(tn, "name");
    if (t.name.empty()) r.fail(tn, "empty tensor name");
    if (!names.insert(t.name).second) r.fail(tn["name"], "tensor '" + t.name + "' is listed twice");
    const std::string what = "tensor '" + t.name + "'";
    t.dtype = r.scalar<std::string>(tn, "dtype");
    const size_t esize = dtype_bytes(t.dtype);
    if (!esize) r.fail(tn["dtype"], what + ": unknown dtype '" + t.dtype + "'");
    t.shape = r.ints(tn, "shape", 0);
    if (t.shape.size() > 16) r.fail(tn["shape"], what + ": more than 16 dims");
    if (!numel(t.shape)) r.fail(tn["shape"], what + ": too many elements");
    if (YAML::Node l = tn["layout"]) t.layout = l.IsScalar() ? r.text(l, "'layout'") : "";
    if (YAML::Node b = tn["buffer"]) {
      if (!b.IsScalar()) r.fail(b, what + ": 'buffer' must be true or false");
      try {
        t.buffer = b.as<bool>();
      } catch (const YAML::Exception&) {
        r.fail(b, what + ": 'buffer' must be true or false");
      }
    }

    // Pieces must partition the tensor: the same dims split the same way in
    // every piece, each combination of indices exactly once.
    std::vector<std::pair<int64_t, int64_t>> grid;  // (dim, parts) of the first piece
    std::set<std::vector<int64_t>> seen;
    uint64_t expected = 1;
    const YAML::Node pieces = r.need(tn, "pieces", YAML::NodeType::Sequence);
    for (const auto& pn : pieces) {
      Piece p;
      p.rank = static_cast<int>(r.dim_value(r.need(pn, "rank", YAML::NodeType::Scalar), 0));
      if (p.rank >= meta.world_size) r.fail(pn["rank"], what + ": rank " + std::to_string(p.rank) + " outside the world");
      p.file = r.scalar<std::string>(pn, "file");
      const fs::path f(p.file);
      if (p.file.empty() || f.is_absolute() || p.file.find("..") != std::string::npos || f.has_parent_path())
        r.fail(pn["file"], what + ": piece file '" + p.file + "' must be a plain file name in the checkpoint");
      p.offset = r.scalar<uint64_t>(pn, "offset");
      p.nbytes = r.scalar<uint64_t>(pn, "nbytes");
      if (p.offset > (uint64_t{1} << 62) || p.nbytes > (uint64_t{1} << 62)) r.fail(pn, what + ": offset or size too large");
      p.shape = r.ints(pn, "shape", 0);
      p.crc32c = r.scalar<uint32_t>(pn, "crc32c");
      std::vector<int64_t> key;
      std::vector<std::pair<int64_t, int64_t>> dims;
      for (const auto& sn : r.need(pn, "split", YAML::NodeType::Sequence)) {
        if (!sn.IsMap()) r.fail(sn, what + ": a split is {dim, axis, parts, index, blocks[, shared]}");
        DimSplit s;
        s.dim = r.dim_value(r.need(sn, "dim", YAML::NodeType::Scalar), 0);
        s.axis = r.scalar<std::string>(sn, "axis");
        s.parts = r.dim_value(r.need(sn, "parts", YAML::NodeType::Scalar), 1);
        s.index = r.dim_value(r.need(sn, "index", YAML::NodeType::Scalar), 0);
        s.blocks = r.dim_value(r.need(sn, "blocks", YAML::NodeType::Scalar), 1);
        if (YAML::Node shared = sn["shared"]) s.shared = r.dim_value(shared, 1);
        if (s.parts > meta.world_size || s.shared > meta.world_size)
          r.fail(sn, what + ": split into more parts, or shared by more ranks, than the world has");
        {
          bool known = false;
          for (const auto& a : meta.mesh) known |= a.first == s.axis && a.second == s.parts * s.shared;
          if (!known)
            r.fail(sn, what + ": split over '" + s.axis + "' in " + std::to_string(s.parts) + " parts" +
                           (s.shared > 1 ? " each on " + std::to_string(s.shared) + " ranks" : std::string()) +
                           ", which the mesh does not have");
        }
        if (s.dim >= static_cast<int64_t>(t.shape.size())) r.fail(sn, what + ": split dim out of range");
        if (s.index >= s.parts) r.fail(sn, what + ": split index not below parts");
        if (t.shape[s.dim] % s.blocks != 0) r.fail(sn, what + ": blocks do not divide dim " + std::to_string(s.dim));
        for (const auto& d : dims)
          if (d.first == s.dim) r.fail(sn, what + ": dim " + std::to_string(s.dim) + " split twice");
        dims.emplace_back(s.dim, s.parts);
        key.push_back(s.index);
        p.split.push_back(s);
      }
      if (grid.empty() && t.pieces.empty()) {
        grid = dims;
        for (const auto& d : grid) expected *= static_cast<uint64_t>(d.second);
      } else if (dims != grid) {
        r.fail(pn, what + ": pieces are split differently");
      }
      if (!seen.insert(key).second) r.fail(pn, what + ": two pieces hold the same part");
      // The piece's shape follows from the split.
      std::vector<int64_t> want = t.shape;
      for (const auto& s : p.split) {
        want[s.dim] = chunk_len(t.shape[s.dim] / s.blocks, s.parts, s.index) * s.blocks;
      }
      if (p.shape != want) r.fail(pn["shape"], what + ": piece shape disagrees with its split");
      if (p.nbytes != *numel(p.shape) * esize) r.fail(pn["nbytes"], what + ": nbytes disagrees with shape and dtype");
      t.pieces.push_back(std::move(p));
    }
    if (complete && t.pieces.empty()) r.fail(pieces, what + " has no pieces");
    if (complete && seen.size() != expected)
      r.fail(pieces, what + ": " + std::to_string(seen.size()) + " of " + std::to_string(expected) + " pieces present");
    meta.tensors.push_back(std::move(t));
  }
  return meta;
}

}  // namespace ckpt
}  // namespace shardplan
