#pragma once
// The subcommands of shardplan-ckpt (`shardplan ckpt ...`), one per file.
// Each takes its own argv (argv[0] is the subcommand) and returns the exit
// status: 0 success, 1 failure (named on stderr), 2 usage error.
#include <string>

namespace shardplan_ckpt {

int convert_main(int argc, char** argv);
int inspect_main(int argc, char** argv);

// A plain torch::save file of the model in checkpoint `dir` (whole tensors,
// no optimizer state), as torch::nn::Module::save writes one: one archive per
// submodule, parameters and buffers by their local names.
void write_full(const std::string& dir, const std::string& file);

// `convert --to safetensors`: the whole tensors of checkpoint `dir` as
// safetensors (`out` a .safetensors file, or a directory: Hugging Face's
// layout, several files and an index above 5 GB).
void checkpoint_to_safetensors(const std::string& dir, const std::string& out);
// `convert --from safetensors`: the weights at `src` (any form load_weights
// reads) as a checkpoint for `world` ranks; tensors are stored whole, and
// load_checkpoint cuts them by the loading model's plan.
void safetensors_to_checkpoint(const std::string& src, const std::string& dir, int world, const std::string& plan_yaml);

// The usage text of every subcommand.
extern const char* const kUsage;

}  // namespace shardplan_ckpt
