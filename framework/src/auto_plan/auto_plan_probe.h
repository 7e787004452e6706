#pragma once
// auto_plan's view of a model: its shardable layers (every path each is
// registered under) and, after a probe forward, who feeds whom
// (auto_plan_probe.cpp). auto_plan.cpp turns that into rules.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

namespace torch {
namespace nn {
class Module;
}
namespace autograd {
struct Node;
}
}  // namespace torch

namespace shardplan {
namespace auto_detail {

enum class Kind { Linear, Conv, Embedding, Attention, LSTM, CrossEntropy };

struct Layer {
  Kind kind;
  torch::nn::Module* module = nullptr;
  std::vector<std::string> paths;  // every path the module is registered under, "" for the root
  std::string name() const;        // the first path, or "(root)"
  // Parameters: name within the module ("weight", "out_proj.weight") and shape.
  std::vector<std::pair<std::string, std::vector<int64_t>>> params;
  // From the probe: how many times forward ran, and the first call's
  // tensors (Linear, Conv and CrossEntropyLoss record; the others only count).
  int calls = 0;
  at::Tensor input, output;
  std::vector<at::Tensor> later_outputs;  // the other calls' outputs
  // Linear: out_features; Conv: out_channels; Embedding: num_embeddings.
  int64_t width = 0;
  int64_t groups = 1;  // Conv
  bool inside_attention = false;  // MultiheadAttention's out_proj: its own business
};

// How a layer's input was made from other layers' outputs.
struct Feed {
  std::vector<Layer*> producers;  // layers whose outputs reach the input (in probe order)
  std::vector<std::string> ops;   // operations on the way, in graph order, deduplicated
  std::string why_not;            // non-empty: the input is not made only that way
  // No layer computes the input (the model's input feeds it): true of every
  // first layer, so it is no reason for one to stay replicated.
  bool starts_chain = false;
  // Producers the walk found, whose pairing with the consumer then failed
  // for a cause that keeps them replicated too (their output read outside
  // the pair, a consumer that runs more than once), and that cause.
  std::vector<Layer*> held_back;
  std::string held_back_why;
};

class ProbeGraph {
 public:
  // Finds the shardable layers; throws shardplan::Error when one already has
  // a strategy (the model is sharded).
  explicit ProbeGraph(torch::nn::Module& model);
  ~ProbeGraph();

  // Runs `probe` with recording strategies installed, in eval mode and with
  // grad mode on, then restores the model. Keeps the graph of the result.
  void run(const std::function<at::Tensor(torch::nn::Module&)>& probe);
  bool probed() const { return root_.defined(); }

  const std::vector<Layer>& layers() const { return layers_; }
  // Layers in the order of their first call in the probe (uncalled ones
  // last, in module order).
  std::vector<Layer*> call_order();

  // Which layers of kind `producer_kind` feed `consumer`'s input, through
  // operations allowed by `allowed_op`, with nothing else consuming the
  // activations on the way (only `consumer` reads them). With `constants`,
  // operations may also take tensors that need no gradient (an attention's
  // causal mask, rotary tables); without, every operand must be a layer's.
  // On success, and when only the readers fail, f.ops lists the operations.
  Feed feed(const Layer& consumer, Kind producer_kind, const std::function<bool(const std::string&)>& allowed_op,
            bool constants = false);

 private:
  struct Recording;
  // Anything but the chain and the consumer reading the chain's activations.
  void check_readers(const Layer& consumer, const std::unordered_set<torch::autograd::Node*>& chain, Feed& f);
  // "fc3 (a second consumer)", "add (a residual)", "mean": who `reader` is.
  std::string reader_name(torch::autograd::Node* reader) const;
  torch::nn::Module& model_;
  std::vector<Layer> layers_;
  at::Tensor root_;
  std::unique_ptr<Recording> rec_;
  std::map<torch::autograd::Node*, std::vector<torch::autograd::Node*>> consumers_;
  std::map<torch::autograd::Node*, Layer*> made_by_;
  std::vector<Layer*> first_called_;
};

// The operation names the pairings accept, as autograd names them.
bool is_elementwise_unary(const std::string& op);   // relu, gelu, tanh, scalar mul, ...
bool is_elementwise_binary(const std::string& op);  // tensor + - * / tensor
bool is_channel_preserving(const std::string& op);  // pooling over spatial dims
bool is_view(const std::string& op);                // view / reshape
// What attention does between its projections and its output projection:
// the above, and transposes, batched products, softmax, slices and
// concatenations (rotary embeddings), index_select (grouped queries' kv
// heads repeated), casts. Whether heads stay apart is not the op's business:
// split_heads() tests that on the probe's graph.
bool is_attention_op(const std::string& op);
std::string op_short(const std::string& op);        // "GeluBackward0" -> "gelu"

// Attention built from separate Linears (q, k, v -> o_proj, as Llama's),
// read from the probe (auto_plan_heads.cpp).
struct HeadSplit {
  // o's input is a softmax attention over several Linears' outputs; false:
  // not attention, other units may take the layers.
  bool attention = false;
  std::vector<Layer*> projections;  // q, k, v, in probe order
  std::vector<bool> replicate;      // per projection: fewer heads than ranks (replicate_heads)
  // One projection computing q, k and v stacked (GPT-2's c_attn): 3, each
  // block split by heads (a rule's blocks: 3); else 1.
  int64_t blocks = 1;
  int64_t head_dim = 0;             // from the reshape of the heads' context into o's input
  int64_t heads = 0;                // o's input heads: the query heads
  std::string why_not;              // attention, but not split at `ranks` (the layers' reason)
};

// Whether `o` is such an attention's output projection, and whether its
// heads split among `ranks`: the query heads divide among them, each
// projection's heads divide among them or they among its heads, and the
// probe's graph shows each rank's share of o's input computed from that
// rank's heads of every projection alone (a vector-Jacobian product per rank).
HeadSplit split_heads(ProbeGraph& graph, const Layer& o, int ranks);

}  // namespace auto_detail
}  // namespace shardplan
