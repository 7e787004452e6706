#pragma once
// Weights trained elsewhere, in and out (docs/WEIGHTS.md): safetensors files
// (one, or a directory with model.safetensors.index.json) and torch.save
// state dicts (pytorch_model.bin, .pt), loaded shard-on-load: each rank maps
// the files and copies only its own rows, columns or blocks into its shards,
// never building a whole tensor. Saving writes whole tensors under their
// original names as safetensors, which Python's safetensors and transformers
// read.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/checkpoint.h"
#include "shardplan/parallelize.h"

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace shardplan {

class DataParallel;
class World;

struct WeightsOptions {
  // Names in the file -> names in the model: each (regex, replacement) pair
  // is applied in order to every name in the file, each match replaced as
  // std::regex_replace does (ECMAScript; $1 for groups, $& the match), e.g.
  // {"^transformer\\.", ""} or {"\\.gamma$", ".weight"}. Names are matched
  // after all rules ran. RE2 runs the patterns (time linear in the name);
  // back-references, lookahead, a $N the pattern lacks, more than 1000 rules,
  // more than 256 matches of a rule in one name, or a name grown past 1 MiB
  // are errors (docs/WEIGHTS.md).
  std::vector<std::pair<std::string, std::string>> rename;
  // Strict: any model parameter the file lacks, or any file tensor the model
  // lacks, is an error listing all of them, and nothing is loaded. Not
  // strict: they are returned as warnings and the rest is loaded. Buffers
  // the file lacks are never an error (Hugging Face files leave out
  // non-persistent buffers); they keep their values.
  bool strict = true;
  // File tensors stored transposed: a tensor whose name in the file (before
  // rename) fully matches one of these patterns (RE2, as rename) is 2-D and
  // stored [in, out], as GPT-2's Conv1D keeps its weight, and loads into its
  // parameter's transpose. Still shard-on-load: a rank reads, as a strided
  // view, only the file's columns that are its rows of the parameter. A
  // matched tensor that is not 2-D is an error.
  std::vector<std::string> transposed;
  // Benchmarks and tests only: read each tensor whole, then cut this rank's
  // shard from it (what a loader without shard-on-load does).
  bool whole_then_slice = false;
  // A file tensor that is several model parameters stacked along dim 0
  // (Phi-3's qkv_proj, gate_up_proj): `pattern` (the rename rules' syntax)
  // must match the whole name as in the file, before any rename; `parts`
  // name model parameters (no rename applies; $1 etc. are the pattern's
  // groups) with their rows, in order, summing to the tensor's dim 0. Each
  // part loads as a parameter of its own, shard-on-load: a rank reads only
  // the rows of each part its shard covers. At most 1000 rules, 64 parts.
  struct FusedWeight {
    std::string pattern;
    std::vector<std::pair<std::string, int64_t>> parts;  // (model name, rows)
  };
  std::vector<FusedWeight> fused;
};

// Throws Error naming the first rule of a WeightsOptions::rename that is
// refused (load_weights checks the same before it changes anything).
void check_rename_rules(const std::vector<std::pair<std::string, std::string>>& rename);

// The model name a file's tensor `name` is matched under: options.rename
// applied as load_weights applies it. Throws Error as load_weights would.
std::string renamed_weight_name(const WeightsOptions& options, const std::string& name);

struct WeightsReport {
  std::vector<std::string> loaded;      // model names, in model order (a tie group once)
  std::vector<std::string> missing;     // model parameters the file lacks (non-strict)
  std::vector<std::string> unexpected;  // file tensors (as named in the file; a fused tensor's part as
                                        // "file name (part model name)") the model lacks (non-strict)
  std::vector<std::string> warnings;    // one line each: the above, and buffers left as they were
  int64_t bytes_copied = 0;             // bytes written into this rank's tensors
};

// Loads the weights at `path` (a .safetensors file; a torch.save zip file
// .bin/.pt/.pth; or a directory with model.safetensors.index.json,
// model.safetensors, pytorch_model.bin.index.json or pytorch_model.bin)
// into this rank's shards of `model`, as `report` (from parallelize(); a
// default ParallelReport for an unsharded model) cut them. Converts each
// tensor to its parameter's dtype. Tied parameters are loaded once, from
// whichever of their names the file has. Not collective: every rank reads
// its own shard. All files, names, shapes and offsets are checked before
// the first parameter changes, so a failed load (shardplan::Error, one
// line naming the file and the tensor) leaves the model as it was.
WeightsReport load_weights(torch::nn::Module& model, const ParallelReport& report, const std::string& path,
                           const WeightsOptions& options = {});

// The same under ZeRO-3 (`data_parallel: {zero: 3}`), after `dp` was made
// over `model`: a parameter of a unit, which between uses is only this
// rank's 1/D slice of its TP shard, is loaded into that slice alone, from
// the rows of the file the slice covers, so no rank holds its whole shard
// (bytes_copied counts the slices' bytes). Parameters kept whole (ignored,
// tied, frozen, outside every layer) and any DataParallel below stage 3
// load as above. Not collective. Throws Error, changing nothing, while the
// parameters are whole (inside DataParallel::WholeParameters, where
// load_weights(model, ...) is the way) or when `dp` is not over `model`.
// load_weights(model, ...) on a ZeRO-3 model refuses its free parameters.
WeightsReport load_weights(DataParallel& dp, torch::nn::Module& model, const ParallelReport& report,
                           const std::string& path, const WeightsOptions& options = {});

struct SaveWeightsOptions {
  // Above this many bytes of tensor data, a directory target is split into
  // model-0000K-of-0000N.safetensors files with model.safetensors.index.json
  // (Hugging Face's layout and default shard size).
  int64_t max_file_bytes = 5'000'000'000;
  int root = 0;  // the rank that writes
  // Tensors written transposed: a 2-D tensor whose model name fully matches
  // one of these patterns (as WeightsOptions::transposed) is written [in, out]
  // (GPT-2's Conv1D layout). A matched tensor that is not 2-D is an error.
  std::vector<std::string> transposed;
  // The inverse of WeightsOptions::fused: (name to write, model parameters)
  // writes those parameters, gathered whole one at a time, concatenated
  // along dim 0 in order as one tensor of that name, where the first of
  // them in model order would stand. At most 100,000 entries, 64
  // parameters each.
  std::vector<std::pair<std::string, std::vector<std::string>>> fused;
};

// Collective over `world`. Writes the whole tensors (parameters, then
// buffers; a tied tensor once, under its first name) as safetensors: to
// `path` itself when it ends in ".safetensors", otherwise into directory
// `path` (model.safetensors, or several files and an index). Tensors are
// gathered one at a time, so the writing rank holds one whole tensor at a
// time. Each file is written beside its target and renamed into place.
void save_weights_safetensors(torch::nn::Module& model, const ParallelReport& report, World& world,
                              const std::string& path, const SaveWeightsOptions& options = {});

// Offline (no model, no world): writes `tensors` as save_weights_safetensors
// would, for `shardplan ckpt convert --to safetensors`.
void write_safetensors(const std::string& path, const StateDict& tensors, const SaveWeightsOptions& options = {});

// Every tensor of the weights at `path` (any form load_weights reads), whole,
// in the file's dtype and order, copied out of the file.
StateDict read_weights(const std::string& path);

// The name and shape of every tensor at `path` (any form load_weights
// reads), from its headers only: no tensor data is read. For checks before
// a model is built, such as config.json's sizes against the weights.
std::vector<std::pair<std::string, std::vector<int64_t>>> weights_shapes(const std::string& path);

}  // namespace shardplan
