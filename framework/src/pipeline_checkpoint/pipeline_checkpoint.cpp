// Sharded checkpoints of a pipelined model: checkpoint.cpp's saving and
// loading over one stage's tensors, the pipe axis' ranks each writing their
// own (shardplan/pipeline_checkpoint.h).
#include "shardplan/pipeline_checkpoint.h"

#include <torch/nn/module.h>

#include <optional>
#include <set>
#include <vector>

#include "checkpoint/checkpoint_internal.h"
#include "shardplan/data_parallel.h"
#include "shardplan/zero_optimizer.h"

namespace shardplan {

namespace {

bool under_any(const std::string& path, const std::vector<std::string>& modules) {
  for (const std::string& m : modules)
    if (path.size() > m.size() && path.compare(0, m.size(), m) == 0 && path[m.size()] == '.') return true;
  return false;
}

// This rank's stage: its parameters under every name the model gives them
// (so the checkpoint names a tie as one process' would), and its pieces'
// buffers; a buffer under no piece is every stage's, written by stage 0.
ckpt_detail::ModelTensors stage_tensors(const Pipeline& pipe, torch::nn::Module& model) {
  ckpt_detail::ModelTensors m;
  m.apart_axis = pipe.axis();
  std::set<const void*> kept;
  for (const auto& p : pipe.named_parameters()) kept.insert(p.second.unsafeGetTensorImpl());
  for (const auto& p : model.named_parameters()) {
    if (!kept.count(p.value().unsafeGetTensorImpl())) continue;
    m.parameters.emplace_back(p.key(), p.value());
    if (!pipe.saves(p.value())) m.copies.insert(p.key());
  }
  const auto pieces = pipe.model_pieces().pieces();
  std::vector<std::string> mine, all;
  for (const auto& [first, end] : pipe.chunks())
    for (size_t i = first; i < end; ++i) mine.insert(mine.end(), pieces[i].begin(), pieces[i].end());
  for (const auto& piece : pieces) all.insert(all.end(), piece.begin(), piece.end());
  for (const auto& b : model.named_buffers()) {
    const bool here = under_any(b.key(), mine);
    if (!here && under_any(b.key(), all)) continue;
    m.buffers.emplace_back(b.key(), b.value());
    if (!here && pipe.stage() != 0) m.copies.insert(b.key());
  }
  for (const auto& s : model.named_modules("", /*include_self=*/false)) m.modules.push_back(s.key());
  return m;
}

}  // namespace

// ZeRO-3's parameters are whole for the checkpoint's life, as in checkpoint.cpp.
void save_checkpoint(const std::string& dir, const Pipeline& pipe, torch::nn::Module& model,
                     const ParallelReport& report, World& world, const CheckpointOptions& options) {
  std::optional<DataParallel::WholeParameters> whole;
  if (options.zero) whole.emplace(options.zero->data_parallel());
  ckpt_detail::save_model_checkpoint(dir, stage_tensors(pipe, model), report, world, options);
}

std::map<std::string, std::string> load_checkpoint(const std::string& dir, const Pipeline& pipe,
                                                   torch::nn::Module& model, const ParallelReport& report,
                                                   World& world, const CheckpointOptions& options) {
  std::optional<DataParallel::WholeParameters> whole;
  if (options.zero) whole.emplace(options.zero->data_parallel());
  return ckpt_detail::load_model_checkpoint(dir, stage_tensors(pipe, model), report, world, options);
}

}  // namespace shardplan
