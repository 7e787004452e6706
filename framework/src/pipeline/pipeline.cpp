// Pipeline: one rank's part of a pipelined step.
#include <algorithm>
#include <map>
#include <set>

#include "nn/deferred_internal.h"
#include "pipeline_internal.h"
#include "shardplan/error.h"
#include "shardplan/tied.h"

namespace shardplan {

namespace {

std::map<std::string, std::shared_ptr<torch::nn::Module>> modules_by_path(torch::nn::Module& model) {
  std::map<std::string, std::shared_ptr<torch::nn::Module>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) out[item.key()] = item.value();
  return out;
}

bool inside_module(const std::string& path, const std::string& module) {
  return path.size() > module.size() && path.compare(0, module.size(), module) == 0 && path[module.size()] == '.';
}

// Each piece's parameter count, for `stages: auto`.
std::vector<int64_t> piece_params(torch::nn::Module& model, const std::vector<std::vector<std::string>>& pieces) {
  const auto modules = modules_by_path(model);
  std::vector<int64_t> counts;
  for (const auto& piece : pieces) {
    int64_t n = 0;
    for (const std::string& path : piece) {
      const auto it = modules.find(path);
      if (it == modules.end()) throw Error("pipeline: the model's pieces name module '" + path + "', which it has not");
      for (const auto& p : it->second->named_parameters()) n += p.value().numel();
    }
    counts.push_back(n);
  }
  return counts;
}

}  // namespace

Pipeline::Pipeline(torch::nn::Module& model, PipelineModel& pieces, const Plan& plan, World& world,
                   const ParallelReport* report, const at::Tensor& sample)
    : pieces_(pieces), axis_(plan.pipeline.axis) {
  const PipelineSpec& spec = plan.pipeline;
  if (!spec.enabled) throw PlanError(SourceLoc{plan.source, 1, 1}, "the plan has no pipeline: key");
  const Mesh mesh = plan.resolve_mesh(world.size());
  stages_ = mesh.axis_size(spec.axis);
  virtual_ = spec.virtual_stages;
  micro_ = spec.micro_batches;
  // What check_pipeline leaves to the world size when the axis is `auto`.
  if (spec.schedule == "1f1b" && micro_ < stages_)
    throw PlanError(spec.micro_batches_loc, "schedule 1f1b needs at least as many micro_batches as stages (" +
                                                std::to_string(stages_) + "), got " + std::to_string(micro_));
  const auto piece_list = pieces.pieces();
  const bool by_time = spec.stages.empty() && spec.balance == "time";
  const StageRanges all = assign_stages(
      piece_list, by_time ? time_pieces(model, pieces, sample, micro_, world) : piece_params(model, piece_list), spec,
      stages_ * virtual_);
  group_ = world.group(mesh, spec.axis);
  stage_ = group_->rank();
  schedule_ = pipeline_schedule(spec.schedule, stages_, micro_, virtual_);
  for (int c = 0; c < virtual_; ++c) chunks_.push_back(all[model_stage(c)]);
  std::vector<int> rank_of_piece(piece_list.size());
  for (size_t k = 0; k < all.size(); ++k)
    for (size_t i = all[k].first; i < all[k].second; ++i) rank_of_piece[i] = static_cast<int>(k) % stages_;
  keep_parameters(model, piece_list, rank_of_piece);
  shapes_.assign(virtual_, {{}, at::kFloat});
  const std::string batch = plan.batch_axis();
  if (!batch.empty() && mesh.has_axis(batch)) {
    if (!report)
      throw Error("pipeline: the plan's batch axis '" + batch +
                  "' needs parallelize()'s report: Pipeline(model, pieces, plan, world, &report)");
    dp_ = std::make_unique<DataParallel>(params_, *report, plan, world);
  }
}

Pipeline::~Pipeline() = default;

void Pipeline::keep_parameters(torch::nn::Module& model, const std::vector<std::vector<std::string>>& pieces,
                               const std::vector<int>& rank_of_piece) {
  auto piece_of = [&pieces](const std::string& path) {
    for (size_t i = 0; i < pieces.size(); ++i)
      for (const std::string& m : pieces[i])
        if (inside_module(path, m)) return static_cast<int>(i);
    throw Error("pipeline: parameter '" + path + "' is under none of the model's pieces");
  };
  const auto named = model.named_parameters();
  std::set<const void*> kept;
  for (const auto& p : named)
    if (rank_of_piece[piece_of(p.key())] == stage_ && kept.insert(p.value().unsafeGetTensorImpl()).second)
      params_.emplace_back(p.key(), p.value());
  // A tie within one rank's pieces is one tensor there; across ranks each
  // keeps a copy. Decided from the pieces alone, so every rank agrees.
  for (const auto& group : tied_parameters(model)) {
    std::set<int> ranks;
    for (const std::string& path : group) ranks.insert(rank_of_piece[piece_of(path)]);
    if (ranks.size() > 1) tied_.emplace_back(named[group.front()], ranks.count(stage_) > 0);
    if (ranks.size() > 1 && ranks.count(stage_) && *ranks.begin() != stage_)
      saved_elsewhere_.push_back(named[group.front()].unsafeGetTensorImpl());
  }
  // Other stages' parameters never take part here: their memory goes back,
  // so that a rank holds its stage's parameters only.
  for (auto& p : model.named_parameters())
    if (!kept.count(p.value().unsafeGetTensorImpl())) nn::detail::release_to_zero_page(p.value());
}

bool Pipeline::saves(const at::Tensor& parameter) const {
  const void* impl = parameter.unsafeGetTensorImpl();
  return std::find(saved_elsewhere_.begin(), saved_elsewhere_.end(), impl) == saved_elsewhere_.end();
}

std::vector<at::Tensor> Pipeline::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& p : params_) out.push_back(p.second);
  return out;
}

}  // namespace shardplan
