// The communication of sharded TorchScript graphs as custom operators: one
// schema per conjugate pair of mappings.h and the vocab-parallel
// cross-entropy of nn/cross_entropy.h, registered once, here, for every
// graph of the process (a plugin registering them too would abort at load).
// The kernels are catch-all, so autograd sees what mappings.h records.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <mutex>
#include <vector>

#include "script_internal.h"
#include "shardplan/error.h"
#include "shardplan/mappings.h"
#include "shardplan/nn/cross_entropy.h"

namespace shardplan::script_detail {

namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
// Index + 1 is the id; a slot whose group died is reused.
std::vector<std::weak_ptr<Communicator>>& registry() {
  static std::vector<std::weak_ptr<Communicator>> r;
  return r;
}

std::shared_ptr<Communicator> group_of(int64_t id) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& r = registry();
  std::shared_ptr<Communicator> g;
  if (id >= 1 && id <= static_cast<int64_t>(r.size())) g = r[id - 1].lock();
  if (!g)
    throw Error("a sharded TorchScript module ran after the World it was sharded for was destroyed (group id " +
                std::to_string(id) + ")");
  return g;
}

at::Tensor copy_to(const at::Tensor& x, int64_t group) { return copy_to_group(x, *group_of(group)); }
at::Tensor reduce_from(const at::Tensor& x, int64_t group) { return reduce_from_group(x, *group_of(group)); }
at::Tensor gather_from(const at::Tensor& x, int64_t group, int64_t dim) {
  return gather_from_group(x, *group_of(group), dim);
}
at::Tensor scatter_to(const at::Tensor& x, int64_t group, int64_t dim) {
  return scatter_to_group(x, *group_of(group), dim);
}

// Megatron's VocabParallelEmbedding: ids outside this rank's rows
// [begin, begin + rows) look up row 0 and are zeroed, the partial rows summed.
// padding_idx is global; it keeps its meaning on the rank that owns it.
at::Tensor vocab_embedding(const at::Tensor& weight, const at::Tensor& ids, int64_t padding_idx, int64_t begin,
                           int64_t group) {
  const int64_t rows = weight.size(0);
  const at::Tensor outside = at::logical_or(ids < begin, ids >= begin + rows);
  const at::Tensor local = (ids - begin).masked_fill(outside, 0);
  const bool owns_padding = padding_idx >= begin && padding_idx < begin + rows;
  at::Tensor y = at::embedding(weight, local, owns_padding ? padding_idx - begin : -1);
  y = y.masked_fill(outside.unsqueeze(-1), 0);
  return reduce_from_group(y, *group_of(group));
}

// aten::cross_entropy_loss of logits whose classes are split over the group
// (a column-parallel output left sharded): Megatron's vocab-parallel loss,
// whose backward gives each rank the gradient of its slice. The sharded dim
// is the logits' last, so it must be the class dim: [N, C/n] or [C/n].
at::Tensor vocab_cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                               const c10::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index,
                               double label_smoothing, int64_t group) {
  if (logits.dim() > 2)
    throw Error("shardplan::vocab_cross_entropy: the logits' classes are split along their last dim, but "
                "cross_entropy reads classes from dim 1 of these " + std::to_string(logits.dim()) +
                "-D logits; view them as (-1, logits.size(-1)) before the loss");
  torch::nn::CrossEntropyLossOptions o;
  // The full [C] weights: vocab_parallel_cross_entropy reads this rank's range.
  if (weight && weight->defined()) o.weight(*weight);
  if (reduction == at::Reduction::None)
    o.reduction(torch::kNone);
  else if (reduction == at::Reduction::Sum)
    o.reduction(torch::kSum);
  o.ignore_index(ignore_index).label_smoothing(label_smoothing);
  return vocab_parallel_cross_entropy(logits, target, *group_of(group), o);
}

}  // namespace

int64_t register_group(const std::shared_ptr<Communicator>& group) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& r = registry();
  for (size_t i = 0; i < r.size(); ++i)
    if (r[i].lock() == group) return static_cast<int64_t>(i) + 1;
  for (size_t i = 0; i < r.size(); ++i)
    if (r[i].expired()) {
      r[i] = group;
      return static_cast<int64_t>(i) + 1;
    }
  r.push_back(group);
  return static_cast<int64_t>(r.size());
}

}  // namespace shardplan::script_detail

TORCH_LIBRARY(shardplan, m) {
  using namespace shardplan::script_detail;
  m.def("copy_to(Tensor x, int group) -> Tensor", copy_to);
  m.def("reduce_from(Tensor x, int group) -> Tensor", reduce_from);
  m.def("gather_from(Tensor x, int group, int dim) -> Tensor", gather_from);
  m.def("scatter_to(Tensor x, int group, int dim) -> Tensor", scatter_to);
  m.def("vocab_embedding(Tensor weight, Tensor ids, int padding_idx, int begin, int group) -> Tensor",
        vocab_embedding);
  m.def("vocab_cross_entropy(Tensor logits, Tensor target, Tensor? weight, int reduction, int ignore_index, "
        "float label_smoothing, int group) -> Tensor",
        vocab_cross_entropy);
}
