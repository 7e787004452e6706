// time_pieces: what `stages: {auto: time}` balances.
#include <algorithm>
#include <chrono>

#include "shardplan/error.h"
#include "shardplan/pipeline.h"

namespace shardplan {

namespace {

// Puts the model back in the mode it was in, whatever a piece throws.
class EvalScope {
 public:
  explicit EvalScope(torch::nn::Module& model) : model_(model), training_(model.is_training()) { model_.eval(); }
  ~EvalScope() { model_.train(training_); }

 private:
  torch::nn::Module& model_;
  bool training_;
};

}  // namespace

std::vector<int64_t> time_pieces(torch::nn::Module& model, PipelineModel& pieces, const at::Tensor& sample,
                                 int micro_batches, World& world) {
  if (!sample.defined())
    throw Error("pipeline: stages: {auto: time} times each piece's forward on a sample batch; pass one: "
                "Pipeline(model, pieces, plan, world, report, sample)");
  if (sample.dim() == 0 || micro_batches < 1 || sample.size(0) < micro_batches)
    throw Error("pipeline: the sample batch for stages: {auto: time} has fewer than " + std::to_string(micro_batches) +
                " rows along dim 0");
  const size_t n = pieces.pieces().size();
  constexpr int kRuns = 3;  // after one warm-up; their median
  std::vector<std::vector<double>> runs(n);
  {
    EvalScope eval(model);
    torch::NoGradGuard no_grad;
    const at::Tensor first = sample.narrow(0, 0, sample.size(0) / micro_batches);
    for (int r = 0; r <= kRuns; ++r) {
      at::Tensor x = first;
      for (size_t i = 0; i < n; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        x = pieces.forward_piece(i, x);
        const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) runs[i].push_back(ns);
      }
    }
  }
  at::Tensor times = at::zeros({static_cast<int64_t>(n)}, at::kDouble);
  for (size_t i = 0; i < n; ++i) {
    std::sort(runs[i].begin(), runs[i].end());
    times[static_cast<int64_t>(i)] = runs[i][kRuns / 2];
  }
  // The same vector everywhere, so every rank cuts the same stages.
  world.comm().all_reduce(times, ReduceOp::Max);
  std::vector<int64_t> out;
  for (size_t i = 0; i < n; ++i) out.push_back(std::max<int64_t>(1, static_cast<int64_t>(times[i].item<double>())));
  return out;
}

}  // namespace shardplan
