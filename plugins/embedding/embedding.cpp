// The embedding layer plugin: tensor parallelism for shardplan::nn::Embedding.
//
//   weight [axis, null]  vocab-parallel (Megatron's VocabParallelEmbedding):
//                        each rank owns a contiguous range of rows; ids
//                        outside it are looked up as local row 0 and their
//                        output rows zeroed, then the partial outputs are
//                        all-reduced, so the output is whole on every rank.
//                        The vocabulary need not divide: rank r owns
//                        [r*c, min(V, (r+1)*c)) with c = ceil(V/N) (shard_range),
//                        the last ranks fewer rows, possibly none.
//   weight [null, axis]  embedding-dim-parallel: each rank owns
//                        embedding_dim/N columns of every row; output
//                        gathered along the last dim (default) or kept
//                        sharded (`output: sharded`).
//   weight [null, null]  replicated (explicitly planned, nothing to do).
//
// Under sequence parallelism the ids come whole and the output leaves split
// along the sequence: vocab-parallel reduce-scatters the partial rows onto
// it (instead of all-reducing them), replicated and embedding-dim-parallel
// (gathered) keep this rank's part, whose backward all-gathers the gradient,
// so the weight's gradient is whole without further communication.
//
// padding_idx works in both (the padding row gets no gradient wherever it
// lives); scale_grad_by_freq too (vocab-parallel counts each id over the
// whole input, as torch does, not over the masked local ids). max_norm works
// vocab-parallel, where every row is whole on its owner; embedding-dim-parallel
// rejects it, since a row's norm would span ranks. sparse is rejected for
// both sharded layouts. Ids outside [0, num_embeddings) are not diagnosed
// vocab-parallel (they match no rank and give a zero row), because checking
// would cost a device synchronisation per forward.
#include <ATen/ATen.h>

#include <algorithm>

#include "shardplan/communicator.h"
#include "shardplan/layer_plugin.h"
#include "shardplan/mappings.h"
#include "shardplan/nn/embedding.h"
#include "shardplan/plugin_support.h"
#include "shardplan/shard.h"

namespace shardplan {
namespace {

const char* kEmbeddingType = "shardplan::nn::EmbeddingImpl";

std::string range_str(std::pair<int64_t, int64_t> r) {
  return "[" + std::to_string(r.first) + ", " + std::to_string(r.second) + ")";
}

class VocabParallel : public nn::EmbeddingStrategy {
 public:
  VocabParallel(std::shared_ptr<Communicator> group, int64_t vocab, std::pair<int64_t, int64_t> range,
                SequenceShard seq)
      : group_(std::move(group)), vocab_(vocab), begin_(range.first), end_(range.second), seq_(std::move(seq)) {}

  at::Tensor forward(const at::Tensor& ids, const at::Tensor& w, const torch::nn::EmbeddingOptions& o) override {
    const int64_t rows = end_ - begin_;
    at::Tensor y;
    if (rows == 0) {
      auto sizes = ids.sizes().vec();
      sizes.push_back(w.size(1));
      // Adding the (empty) weight's sum keeps the output a function of the
      // weight, so backward() works on a rank that owns no row.
      y = at::zeros(sizes, w.options()) + w.sum();
    } else {
      const at::Tensor outside = at::logical_or(ids < begin_, ids >= end_);
      const at::Tensor local = (ids - begin_).masked_fill(outside, 0);
      if (o.max_norm().has_value()) {
        // In place, as torch's, and only the rows of ids this rank owns:
        // masked ids (row 0) would renormalise a row nobody asked for.
        at::NoGradGuard no_grad;
        at::Tensor weight = w;
        at::embedding_renorm_(weight, local.masked_select(at::logical_not(outside)), *o.max_norm(), o.norm_type());
      }
      int64_t pad = -1;
      if (o.padding_idx().has_value() && *o.padding_idx() >= begin_ && *o.padding_idx() < end_)
        pad = *o.padding_idx() - begin_;
      y = at::embedding(w, local, pad, /*scale_grad_by_freq=*/false, /*sparse=*/false);
      if (o.scale_grad_by_freq() && y.requires_grad()) {
        // torch divides each position's gradient by its id's count in the
        // input; masked positions would inflate local row 0's count, so they
        // are counted in a bin of their own.
        const at::Tensor bins = local.masked_fill(outside, rows).reshape(-1);
        const at::Tensor counts = at::bincount(bins, {}, rows + 1).index_select(0, bins);
        at::Tensor scale = at::reciprocal(counts.to(y.scalar_type())).view(ids.sizes()).unsqueeze(-1);
        y.register_hook([scale](const at::Tensor& g) { return g * scale; });
      }
      y = y.masked_fill(outside.unsqueeze(-1), 0);
    }
    return seq_.on ? reduce_scatter_sequence(y, *group_, seq_.dim) : reduce_from_group(y, *group_);
  }

  std::string describe() const override {
    return "vocab-parallel over '" + group_->name() + "' (" + std::to_string(group_->size()) + "), rows " +
           range_str({begin_, end_}) + " of " + std::to_string(vocab_) + sequence_note(seq_);
  }

 private:
  std::shared_ptr<Communicator> group_;
  int64_t vocab_, begin_, end_;
  SequenceShard seq_;
};

// A replicated table whose output enters the sequence-parallel region.
class ReplicatedSequence : public nn::EmbeddingStrategy {
 public:
  ReplicatedSequence(std::shared_ptr<Communicator> group, SequenceShard seq)
      : group_(std::move(group)), seq_(std::move(seq)) {}

  at::Tensor forward(const at::Tensor& ids, const at::Tensor& w, const torch::nn::EmbeddingOptions& o) override {
    return split_sequence(nn::embedding_lookup(ids, w, o), *group_, seq_.dim);
  }

  std::string describe() const override { return "replicated" + sequence_note(seq_) + " over '" + group_->name() + "'"; }

 private:
  std::shared_ptr<Communicator> group_;
  SequenceShard seq_;
};

class DimParallel : public nn::EmbeddingStrategy {
 public:
  DimParallel(std::shared_ptr<Communicator> group, bool gather, SequenceShard seq)
      : group_(std::move(group)), gather_(gather), seq_(std::move(seq)) {}

  at::Tensor forward(const at::Tensor& ids, const at::Tensor& w, const torch::nn::EmbeddingOptions& o) override {
    // Ids carry no gradient, so unlike a column-parallel Linear no
    // copy_to_group is needed on entry.
    const int64_t pad = o.padding_idx().value_or(-1);
    at::Tensor y = at::embedding(w, ids, pad, o.scale_grad_by_freq(), /*sparse=*/false);
    if (!gather_) return y;
    y = gather_from_group(y, *group_, -1);
    return seq_.on ? split_sequence(y, *group_, seq_.dim) : y;
  }

  std::string describe() const override {
    return "embedding-dim-parallel over '" + group_->name() + "' (" + std::to_string(group_->size()) + "), output " +
           (gather_ ? "gathered" : "sharded") + sequence_note(seq_);
  }

 private:
  std::shared_ptr<Communicator> group_;
  bool gather_;
  SequenceShard seq_;
};

enum class Mode { Replicated, Vocab, Dim };

struct Decision {
  Mode mode = Mode::Replicated;
  std::string axis;
  int64_t parts = 1;
  bool gather = true;
};

Decision decide(const ModuleShard& shard) {
  const ParamShard* w = required_param(shard, "weight");
  const Layout& wl = w->assignment.layout;
  const Rule* rule = rule_of(w);
  Decision d;
  if (wl.size() != 2) fail_param(*w, "an Embedding weight has 2 dims, the layout has " + std::to_string(wl.size()));
  if (wl[0] && wl[1]) fail_param(*w, "an Embedding weight can be split along one dim only, got " + layout_str(wl));
  reject_option(rule, "input", "does not apply to an Embedding (its input is ids, never sharded)");
  reject_option(rule, "blocks", "does not apply to an Embedding");
  reject_option(rule, "overlap", "applies to Linear layers (dense rules)");
  if (!wl[0] && !wl[1]) {
    reject_option(rule, "output", "applies to an embedding-dim-parallel Embedding (weight [null, axis])");
    return d;
  }
  d.axis = wl[0] ? *wl[0] : *wl[1];
  d.parts = shard.mesh->axis_size(d.axis);
  d.mode = wl[0] ? Mode::Vocab : Mode::Dim;
  if (shard.sequence.on && d.axis != shard.sequence.axis)
    fail_param(*w, "split over '" + d.axis + "' but the sequence is split over '" + shard.sequence.axis +
                       "': under sequence parallelism an Embedding must be split over the sequence axis (or have "
                       "sequence_parallel: false)");

  // The options live on the module; check() reads them when it has one.
  if (const auto* m = dynamic_cast<const nn::EmbeddingImpl*>(shard.module)) {
    if (m->options.sparse()) fail_param(*w, "sparse gradients are not supported for a sharded Embedding");
    if (d.mode == Mode::Dim && m->options.max_norm().has_value())
      fail_param(*w, "max_norm renormalises whole rows, which an embedding-dim-parallel Embedding splits over ranks; "
                     "not supported for this layout (vocab-parallel, [" + d.axis + ", null], supports it)");
  }

  if (d.mode == Mode::Vocab) {
    reject_option(rule, "output",
                  "applies to an embedding-dim-parallel Embedding (weight [null, axis]); a vocab-parallel output is "
                  "all-reduced, always whole");
  } else {
    d.gather = output_option_gathered(rule);
    if (shard.sequence.on && !d.gather)
      fail_param(*w, "output: sharded would split the features of an output that sequence parallelism splits "
                     "along the sequence; use output: gathered, or sequence_parallel: false");
    const int64_t dim = w->assignment.shape[1];
    if (dim % d.parts != 0)
      fail_param(*w, "embedding_dim " + std::to_string(dim) + " is not divisible by mesh axis '" + d.axis + "' of size " +
                         std::to_string(d.parts));
  }
  return d;
}

class EmbeddingPlugin : public LayerPlugin {
 public:
  std::string name() const override { return "embedding"; }
  std::vector<std::string> module_types() const override { return {kEmbeddingType}; }

  void check(ModuleShard& shard) const override {
    Decision d = decide(shard);
    ParamShard* w = shard.param("weight");
    const std::string seq = sequence_note(shard.sequence);
    if (d.mode == Mode::Replicated) {
      w->note = "replicated" + seq;
    } else if (d.mode == Mode::Vocab) {
      // Uneven vocabularies give ranks different shapes: report this rank's.
      const int64_t vocab = w->assignment.shape[0];
      const auto range = shard_range(vocab, d.parts, shard.mesh->coord(shard.rank, d.axis));
      w->local_shape[0] = range.second - range.first;
      w->note = "vocab-parallel, rows " + range_str(range) + " of " + std::to_string(vocab) +
                (vocab % d.parts ? " (uneven)" : "") + (shard.sequence.on ? ", output reduce-scattered" + seq : ", output all-reduced");
    } else {
      w->local_shape[1] /= d.parts;
      w->note = std::string("embedding-dim-parallel, output ") + (d.gather ? "gathered" : "sharded") + seq;
    }
  }

  bool supports_sequence_parallel() const override { return true; }

  void apply(ModuleShard& shard) const override {
    Decision d = decide(shard);
    // An axis of one rank splits nothing: torch's own lookup is then exact and
    // cheaper than masking ids for a vocabulary range that is all of it.
    auto& emb = dynamic_cast<nn::EmbeddingImpl&>(*shard.module);
    if (d.mode == Mode::Replicated && shard.sequence.on) {
      emb.set_strategy(std::make_shared<ReplicatedSequence>(shard.group(shard.sequence.axis), shard.sequence));
      return;
    }
    if (d.mode == Mode::Replicated || d.parts == 1) return;
    auto group = shard.group(d.axis);
    const int64_t index = group->rank();
    if (d.mode == Mode::Vocab) {
      const int64_t vocab = emb.weight.size(0);
      const auto range = shard_range(vocab, d.parts, index);
      replace_parameter(emb, "weight", emb.weight.narrow(0, range.first, range.second - range.first));
      emb.set_strategy(std::make_shared<VocabParallel>(group, vocab, range, shard.sequence));
    } else {
      replace_parameter(emb, "weight", shard_of(emb.weight, 1, d.parts, index));
      emb.set_strategy(std::make_shared<DimParallel>(group, d.gather, shard.sequence));
    }
  }
};

}  // namespace
}  // namespace shardplan

SHARDPLAN_LAYER_PLUGIN(shardplan::EmbeddingPlugin, "embedding")
