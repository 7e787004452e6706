// `shardplan ckpt inspect`: what a checkpoint holds, and whether every piece
// is still there with the bytes its checksum promises.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "shardplan/checkpoint_meta.h"

namespace shardplan_ckpt {

namespace {

namespace fs = std::filesystem;
namespace ckpt = shardplan::ckpt;

std::string ints(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

uint64_t numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (auto d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// The problem with one piece, or "".
std::string check_piece(const fs::path& dir, const ckpt::TensorEntry& t, const ckpt::Piece& p) {
  const fs::path path = dir / p.file;
  std::ifstream in(path, std::ios::binary);
  if (!in) return "'" + path.string() + "' is missing (tensor '" + t.name + "', rank " + std::to_string(p.rank) + ")";
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  if (p.offset + p.nbytes > size)
    return "'" + path.string() + "' is truncated: tensor '" + t.name + "' needs bytes " + std::to_string(p.offset) +
           ".." + std::to_string(p.offset + p.nbytes) + " of " + std::to_string(size);
  std::vector<char> buf(1 << 20);
  in.seekg(static_cast<std::streamoff>(p.offset));
  uint32_t crc = 0;
  for (uint64_t left = p.nbytes; left > 0;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
    in.read(buf.data(), static_cast<std::streamsize>(n));
    if (!in) return "cannot read '" + path.string() + "'";
    crc = ckpt::crc32c(buf.data(), n, crc);
    left -= n;
  }
  if (crc != p.crc32c)
    return "'" + path.string() + "' is corrupted: checksum of tensor '" + t.name + "' (bytes " +
           std::to_string(p.offset) + ".." + std::to_string(p.offset + p.nbytes) + ") does not match the metadata";
  return "";
}

}  // namespace

int inspect_main(int argc, char** argv) {
  std::string src;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "-h" || k == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if ((!k.empty() && k[0] == '-') || !src.empty()) {
      std::fprintf(stderr, "shardplan ckpt inspect: unexpected argument '%s'\n%s", k.c_str(), kUsage);
      return 2;
    }
    src = k;
  }
  if (src.empty()) {
    std::fprintf(stderr, "shardplan ckpt inspect: no checkpoint given\n%s", kUsage);
    return 2;
  }
  const fs::path dir(src);
  ckpt::Meta meta;
  try {
    const fs::path mp = dir / ckpt::kMetaFile;
    if (!fs::exists(mp))
      throw std::runtime_error(fs::exists(dir) ? "'" + mp.string() + "' is missing: not a complete checkpoint"
                                               : "no checkpoint at '" + src + "'");
    std::ifstream in(mp, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    meta = ckpt::parse_meta(ss.str(), mp.string());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardplan ckpt inspect: %s\n", e.what());
    return 1;
  }

  std::string mesh;
  for (const auto& a : meta.mesh) mesh += (mesh.empty() ? "" : ", ") + a.first + ": " + std::to_string(a.second);
  std::printf("checkpoint %s\n", src.c_str());
  std::printf("format version %d, world size %d, mesh {%s}\n", meta.format_version, meta.world_size, mesh.c_str());
  int step_attrs = 0;
  for (const auto& kv : meta.attributes) {
    // Per-parameter optimizer step counts are many and alike: counted, not listed.
    if (kv.first.rfind("optimizer/", 0) == 0) {
      ++step_attrs;
      continue;
    }
    std::printf("attribute %s: %s\n", kv.first.c_str(), kv.second.c_str());
  }
  if (step_attrs) std::printf("attribute optimizer/<parameter>/step: %d parameters\n", step_attrs);
  if (meta.plan.empty()) {
    std::printf("plan: none (saved unsharded)\n");
  } else {
    std::printf("plan:\n");
    std::istringstream lines(meta.plan);
    for (std::string line; std::getline(lines, line);) std::printf("  %s\n", line.c_str());
  }

  // Model tensors one per line; optimizer state summed up.
  size_t name_w = 4;
  for (const auto& t : meta.tensors)
    if (t.name.rfind("optimizer/", 0) != 0) name_w = std::max(name_w, t.name.size());
  std::printf("%-*s  %-8s  %-16s  %-16s  %s\n", static_cast<int>(name_w), "name", "dtype", "shape", "layout", "pieces");
  uint64_t model_bytes = 0, opt_bytes = 0;
  size_t opt_tensors = 0, pieces = 0;
  std::map<std::string, std::pair<uint64_t, size_t>> files;  // bytes, pieces
  for (const auto& t : meta.tensors) {
    const uint64_t bytes = numel(t.shape) * ckpt::dtype_bytes(t.dtype);
    for (const auto& p : t.pieces) {
      files[p.file].first += p.nbytes;
      files[p.file].second += 1;
      ++pieces;
    }
    if (t.name.rfind("optimizer/", 0) == 0) {
      opt_bytes += bytes;
      ++opt_tensors;
      continue;
    }
    model_bytes += bytes;
    std::printf("%-*s  %-8s  %-16s  %-16s  %zu%s\n", static_cast<int>(name_w), t.name.c_str(), t.dtype.c_str(),
                ints(t.shape).c_str(), t.layout.empty() ? "-" : t.layout.c_str(), t.pieces.size(),
                t.buffer ? " (buffer)" : "");
  }
  std::printf("model: %zu tensors, %llu bytes whole\n", meta.tensors.size() - opt_tensors,
              static_cast<unsigned long long>(model_bytes));
  if (opt_tensors)
    std::printf("optimizer state (%s): %zu tensors, %llu bytes whole\n",
                meta.attributes.count("optimizer") ? meta.attributes.at("optimizer").c_str() : "?", opt_tensors,
                static_cast<unsigned long long>(opt_bytes));
  for (const auto& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(dir / f.first, ec);
    std::printf("file %s: %zu pieces, %llu bytes", f.first.c_str(), f.second.second,
                static_cast<unsigned long long>(f.second.first));
    if (ec)
      std::printf(" (missing)\n");
    else
      std::printf(" (on disk %llu)\n", static_cast<unsigned long long>(size));
  }

  std::vector<std::string> problems;
  for (const auto& t : meta.tensors)
    for (const auto& p : t.pieces) {
      std::string why = check_piece(dir, t, p);
      if (!why.empty()) problems.push_back(why);
    }
  std::fflush(stdout);
  if (problems.empty()) {
    std::printf("checksums: all %zu pieces verified\n", pieces);
    return 0;
  }
  for (const auto& why : problems) std::fprintf(stderr, "shardplan ckpt inspect: %s\n", why.c_str());
  std::printf("checksums: %zu of %zu pieces bad\n", problems.size(), pieces);
  return 1;
}

}  // namespace shardplan_ckpt
