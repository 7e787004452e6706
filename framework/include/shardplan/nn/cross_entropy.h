#pragma once
// shardplan::nn::CrossEntropyLoss: torch::nn::CrossEntropyLoss with a seam
// for parallelism. Same options, the same "weight" buffer and, with no
// strategy installed, the same forward (the very functional torch's module
// calls, so results are bit-identical). A loss has no parameters, so a plan
// reaches it through a rule over its module path whose layout describes the
// logits it receives (docs/PLAN_FORMAT.md, "Cross-entropy"); the
// cross_entropy plugin then installs a strategy that never gathers them.
#include <torch/nn/cloneable.h>
#include <torch/nn/options/loss.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>

namespace shardplan {

class Communicator;

namespace nn {

// How a CrossEntropyLoss computes from its (possibly sharded) input.
class CrossEntropyStrategy {
 public:
  virtual ~CrossEntropyStrategy() = default;
  virtual at::Tensor forward(const at::Tensor& input, const at::Tensor& target,
                             const torch::nn::CrossEntropyLossOptions& options) = 0;
  virtual std::string describe() const = 0;  // "vocab-parallel over 'model' (2)"
};

class CrossEntropyLossImpl : public torch::nn::Cloneable<CrossEntropyLossImpl> {
 public:
  explicit CrossEntropyLossImpl(const torch::nn::CrossEntropyLossOptions& options_ = {});

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& input, const at::Tensor& target);

  void set_strategy(std::shared_ptr<CrossEntropyStrategy> strategy) { strategy_ = std::move(strategy); }
  const std::shared_ptr<CrossEntropyStrategy>& strategy() const { return strategy_; }

  torch::nn::CrossEntropyLossOptions options;
  at::Tensor weight;  // buffer, as torch's: the full class weights (or undefined)

 private:
  std::shared_ptr<CrossEntropyStrategy> strategy_;
};

TORCH_MODULE(CrossEntropyLoss);

}  // namespace nn

// Megatron's vocab-parallel cross-entropy: the loss of torch's cross_entropy
// over the full logits, computed from this rank's slice of the class dim
// without ever materialising the full class dim on a rank. Differentiable
// with respect to `logits_shard` (custom backward: softmax - one-hot, scaled
// per reduction / ignore_index / label_smoothing as torch does).
//
// logits_shard: [C/n] or [N, C/n, d1, ...] (class dim 1, as torch), rank r
//               holding classes [r*C/n, (r+1)*C/n) of the group.
// target:       class indices over the FULL range, [] or [N, d1, ...];
//               identical on every rank of the group (probability targets
//               are not supported).
// options:      as torch::nn::CrossEntropyLoss; weight, if defined, is either
//               the full [C] class weights (this rank reads a view of its
//               range) or this rank's [C/n] slice.
// Collective over `group`: every rank calls it with the same target.
// bfloat16 and float16 logits are computed in float32 and the loss is
// float32, as Megatron's language-model loss does (logits.float()); the
// gradient reaching the logits has their dtype. CrossEntropyLoss does the
// same unsharded, so the sharded and unsharded runs agree.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits_shard, const at::Tensor& target,
                                        Communicator& group,
                                        const torch::nn::CrossEntropyLossOptions& options = {});

namespace testing {
// Largest class-dim extent of any tensor vocab_parallel_cross_entropy has
// created (forward and backward) since the last reset, across all threads:
// lets tests assert that no rank ever held the full class dim.
int64_t vocab_parallel_widest();
void reset_vocab_parallel_widest();
}  // namespace testing

}  // namespace shardplan
