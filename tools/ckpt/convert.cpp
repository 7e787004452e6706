// `shardplan ckpt convert`: to another world size, or to one plain file.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "commands.h"
#include "shardplan/checkpoint.h"
#include "shardplan/checkpoint_meta.h"
#include "shardplan/count_option.h"

namespace shardplan_ckpt {

namespace {

int usage(const std::string& why) {
  std::fprintf(stderr, "shardplan ckpt convert: %s\n%s", why.c_str(), kUsage);
  return 2;
}

std::string slurp(const std::string& path) {
  std::error_code ec;
  // Checked before opening: a named pipe would block the open.
  if (!std::filesystem::is_regular_file(path, ec)) throw std::runtime_error("'" + path + "' is not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int convert_safetensors(const std::string& src, const std::string& out, bool from, int world,
                        const std::string& plan) {
  try {
    if (from) {
      safetensors_to_checkpoint(src, out, std::max(world, 1), plan.empty() ? "" : slurp(plan));
      std::printf("wrote checkpoint %s from %s\n", out.c_str(), src.c_str());
    } else {
      checkpoint_to_safetensors(src, out);
      std::printf("wrote %s: the whole model of %s as safetensors\n", out.c_str(), src.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardplan ckpt convert: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int convert_main(int argc, char** argv) {
  std::string src, out, plan, to, from;
  int world = 0;
  bool full = false;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&](std::string& v) {
      if (i + 1 >= argc) return false;
      v = argv[++i];
      return true;
    };
    std::string v;
    if (k == "-h" || k == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (k == "--to" || k == "--from") {
      if (!value(k == "--to" ? to : from)) return usage("missing value for " + k);
      if ((k == "--to" ? to : from) != "safetensors") return usage(k + " takes 'safetensors'");
      if (k == "--to" && i + 1 < argc) out = argv[++i];  // convert DIR --to safetensors OUT
      if (k == "--from" && i + 1 < argc) src = argv[++i];
    } else if (k == "--to-world" || k == "--world") {
      if (!value(v)) return usage("missing value for --to-world");
      try {
        world = shardplan::count_option_int(k, v, 1, 1 << 20);
      } catch (const shardplan::CountError& e) {
        return usage(e.what());
      }
    } else if (k == "--out") {
      if (!value(out)) return usage("missing value for --out");
    } else if (k == "--plan") {
      if (!value(plan)) return usage("missing value for --plan");
    } else if (k == "--full") {
      full = true;
    } else if (!k.empty() && k[0] == '-') {
      return usage("unknown option '" + k + "'");
    } else if (src.empty()) {
      src = k;
    } else {
      return usage("more than one source checkpoint ('" + src + "', '" + k + "')");
    }
  }
  if (src.empty()) return usage("no source checkpoint given");
  if (out.empty()) return usage("--out is required");
  if (!to.empty() || !from.empty()) return convert_safetensors(src, out, !from.empty(), world, plan);
  if (full == (world > 0)) return usage("give exactly one of --to-world M and --full");
  if (full && !plan.empty()) return usage("--plan applies to --to-world only");
  try {
    if (full) {
      write_full(src, out);
      std::printf("wrote %s: the whole model of %s (torch::load into the unsharded model)\n", out.c_str(), src.c_str());
    } else {
      shardplan::reshard_checkpoint(src, out, world, plan.empty() ? "" : slurp(plan));
      const auto meta = shardplan::ckpt::parse_meta(slurp(out + "/" + shardplan::ckpt::kMetaFile), out);
      std::string mesh;
      for (const auto& a : meta.mesh) mesh += (mesh.empty() ? "" : ", ") + a.first + ": " + std::to_string(a.second);
      std::printf("wrote %s: world size %d, mesh {%s}, %zu tensors\n", out.c_str(), meta.world_size, mesh.c_str(),
                  meta.tensors.size());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardplan ckpt convert: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace shardplan_ckpt
