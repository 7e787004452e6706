#pragma once
// The example models behind one interface and one registry, so that a
// training driver, the tests and the plan checker can build any of them by
// name: make_model("gpt", {{"layers", "4"}}).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardplan/nn/kv_cache.h"

namespace at {
class Generator;
}
namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace shardplan {
namespace examples {

class Corpus;

// Config overrides as key=value strings; each model parses the keys it knows
// and rejects any other, naming it and the keys it accepts.
using Overrides = std::map<std::string, std::string>;
// "layers=4,embed=128" -> {layers: 4, embed: 128}; throws on a malformed item.
Overrides parse_overrides(const std::string& text);

struct Batch {
  at::Tensor input;   // tokens [B, T] (long) or images [B, C, H, W]
  at::Tensor target;  // next tokens [B, T] or classes [B]
};

// What a driver needs besides torch::nn::Module. Every example model derives
// from this and from torch::nn::Cloneable<its Impl>.
class ExampleModel {
 public:
  virtual ~ExampleModel() = default;
  // The scalar training loss of a batch (the same on every rank of a plan).
  virtual at::Tensor loss(const Batch& batch) = 0;
  // The loss of what the model's forward returned for `target`: what the last
  // stage of a pipeline computes (shardplan/pipeline.h). Models that can be
  // pipelined override it; the others throw.
  virtual at::Tensor output_loss(const at::Tensor& output, const at::Tensor& target);
  // A batch drawn from `gen`: the same generator state gives the same batch
  // on every rank. Language models read `corpus` (ignored otherwise).
  virtual Batch sample(at::Generator& gen, int64_t batch_size, const Corpus* corpus) const = 0;
  virtual bool needs_corpus() const { return false; }
  // Tokens (or samples) per batch element, for throughput.
  virtual int64_t items_per_sample() const = 0;
  virtual std::string items_name() const { return "tokens"; }
  // The fewest bytes one rank must hand to collectives for one training step
  // (forward + backward) under plans/<name>.yaml at `world` ranks, or -1 when
  // the model does not state it.
  virtual int64_t min_comm_bytes(int64_t batch_size, int world, int64_t element_size) const { return -1; }
  // "layers=2 heads=4 ..." with every config value.
  virtual std::string config_str() const = 0;
};

// What text generation (models/generate.h) needs of a language model: the
// GPT and the Llama derive from this too.
class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t context_size() const = 0;
  // One key/value cache per attention layer, for the whole context.
  virtual std::vector<shardplan::nn::KVCache> make_caches() const = 0;
  // tokens [B, T]: the next T positions after the caches' (the prompt, then
  // one token at a time), their keys and values appended to `caches`.
  // Returns their logits [T, B, V] over the whole vocabulary on every rank.
  virtual at::Tensor forward_cached(const at::Tensor& tokens, std::vector<shardplan::nn::KVCache>& caches) = 0;
  // Key/value cache bytes of `batch` sequences over the whole context: what
  // this rank's caches will hold under the plan applied (its own kv heads),
  // and what one unsharded model's would.
  struct CacheBytes {
    int64_t this_rank = 0, unsharded = 0;
  };
  virtual CacheBytes cache_bytes(int64_t batch) const = 0;
};

struct ModelHandle {
  std::shared_ptr<torch::nn::Module> module;
  ExampleModel* model = nullptr;  // the same object as `module`
};

// Builds a freshly initialised model (from torch's global generator).
// Throws shardplan::Error on an unknown name or config key.
ModelHandle make_model(const std::string& name, const Overrides& config = {});
// The same handle view of a clone of a model made by make_model.
ModelHandle as_example(const std::shared_ptr<torch::nn::Module>& module);
std::vector<std::string> model_names();
// One line: what the model is and which config keys it takes.
std::string model_help(const std::string& name);

}  // namespace examples
}  // namespace shardplan
