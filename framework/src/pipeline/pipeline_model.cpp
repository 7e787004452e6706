// SequentialPipeline: a torch::nn::Sequential's children as pieces.
#include "shardplan/error.h"
#include "shardplan/pipeline.h"

namespace shardplan {

SequentialPipeline::SequentialPipeline(torch::nn::Sequential sequential) : sequential_(std::move(sequential)) {
  if (!sequential_) throw Error("SequentialPipeline: the Sequential is empty (nullptr)");
}

std::vector<std::vector<std::string>> SequentialPipeline::pieces() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& child : sequential_->named_children()) out.push_back({child.key()});
  return out;
}

at::Tensor SequentialPipeline::forward_piece(size_t index, const at::Tensor& input) {
  if (index >= sequential_->size())
    throw Error("SequentialPipeline: piece " + std::to_string(index) + " of " + std::to_string(sequential_->size()));
  return (sequential_->begin() + static_cast<std::ptrdiff_t>(index))->forward(input);
}

}  // namespace shardplan
