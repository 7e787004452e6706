// shardplan-ckpt: sharded checkpoints offline (docs/CHECKPOINTS.md). Run as
// `shardplan ckpt ...`; this file only dispatches.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"

namespace shardplan_ckpt {

const char* const kUsage =
    "usage: shardplan ckpt convert SRC --to-world M --out DST [--plan PLAN.yaml]\n"
    "       shardplan ckpt convert SRC --full --out FILE\n"
    "       shardplan ckpt convert SRC --to safetensors OUT\n"
    "       shardplan ckpt convert --from safetensors WEIGHTS --out DST [--world N] [--plan PLAN.yaml]\n"
    "       shardplan ckpt inspect SRC\n"
    "\n"
    "convert --to-world  reshards checkpoint SRC for M ranks into DST (may be SRC), written\n"
    "                    atomically; every tensor keeps its cuts over the mesh of the plan saved\n"
    "                    in SRC (or of --plan) resolved for M ranks. Needs no model.\n"
    "convert --full      writes the whole model (no optimizer state) as a plain torch::save file:\n"
    "                    torch::load(model, FILE) loads it into the unsharded torch::nn model.\n"
    "convert --to safetensors  writes the whole model (no optimizer state) as safetensors under its\n"
    "                    original names: OUT.safetensors is one file; any other OUT a directory with\n"
    "                    model.safetensors, or several files and model.safetensors.index.json over 5 GB.\n"
    "convert --from safetensors  makes checkpoint DST from a .safetensors file, a torch.save state dict\n"
    "                    (.bin/.pt) or a directory of them; for N ranks (and PLAN's mesh) with --world;\n"
    "                    tensors are stored whole and cut by the loading model's plan (--load).\n"
    "inspect             prints the metadata (world size, mesh, plan, attributes, tensors, files)\n"
    "                    and verifies every piece's size and CRC-32C; exit status 1 names each\n"
    "                    file that is missing, truncated or corrupted.\n";

}  // namespace shardplan_ckpt

int main(int argc, char** argv) {
  using namespace shardplan_ckpt;
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "-h" || cmd == "--help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cmd == "convert") return convert_main(argc - 1, argv + 1);
  if (cmd == "inspect") return inspect_main(argc - 1, argv + 1);
  if (cmd.empty())
    std::fprintf(stderr, "shardplan ckpt: missing subcommand\n%s", kUsage);
  else
    std::fprintf(stderr, "shardplan ckpt: unknown subcommand '%s'\n%s", cmd.c_str(), kUsage);
  return 2;
}
