#pragma once
// Deferred initialisation: build a model whose parameters take no memory, so
// that a model larger than one rank's memory can be built, sharded by a
// plan, and filled with its weights (load_weights) shard by shard.
//
//   {
//     shardplan::nn::DeferredInit deferred(at::kFloat);  // this thread only
//     model = std::make_shared<Llama>(config);           // no parameter memory
//   }
//   auto report = shardplan::parallelize(*model, plan, world);  // shards only
//   shardplan::load_weights(*model, report, "weights/");        // fills them
//
// While a DeferredInit lives on a thread, shardplan's layers (nn::Linear,
// Embedding, RMSNorm, LayerNorm, Conv*, LSTM, MultiheadAttention) create
// their parameters in its dtype over a read-only mapping of the zero page
// and skip their random initialisation. Reading one gives zeros and commits
// no memory; a plugin's cut of one (shard_of, replace_parameter) is a shard
// over the zero page too, so a rank gives memory only to what it loads (under
// ZeRO-3, its slices of its shards). PyTorch does this with the meta device; here a real CPU
// tensor is used instead because libtorch 1.13 cannot give a meta parameter
// memory in place (set_data refuses to change its device) and C++ modules
// hold typed members that a replaced tensor would not reach. A deferred
// tensor is an ordinary CPU tensor to every op, so nothing else changes.
//
// What is never filled must not be used: a layer's forward with a deferred
// parameter is an error naming the layer, and load_weights refuses to leave
// one unloaded. Writing into one (model code initialising its weights while
// building: skip that while deferring()) faults on the read-only page; a
// handler installed with the first DeferredInit says why on stderr, then
// the process dies as it would have (other faults go to the handler that
// was there before).
// Parameters a model creates itself (not through shardplan's layers) and
// buffers are allocated as usual.
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace shardplan {
namespace nn {

class DeferredInit {
 public:
  explicit DeferredInit(at::ScalarType dtype = at::kFloat);
  ~DeferredInit();
  DeferredInit(const DeferredInit&) = delete;
  DeferredInit& operator=(const DeferredInit&) = delete;

 private:
  const DeferredInit* previous_;
  at::ScalarType dtype_;
  friend at::Tensor empty_parameter(at::IntArrayRef sizes, const char* name);
  friend bool deferring();
};

// True while a DeferredInit lives on this thread: layers skip initialising.
bool deferring();

// While one lives on this thread, forward reads deferred parameters as the
// zeros they hold instead of refusing: for probes that need the graph only,
// never the numbers (auto_plan's probe forward).
class ReadDeferred {
 public:
  ReadDeferred();
  ~ReadDeferred();
  ReadDeferred(const ReadDeferred&) = delete;
  ReadDeferred& operator=(const ReadDeferred&) = delete;

 private:
  bool previous_;
};

// A layer's parameter storage: torch::empty(sizes) (default dtype), or under
// DeferredInit a deferred tensor of its dtype. `name` ("Embedding.weight")
// is for the message when it cannot be had.
at::Tensor empty_parameter(at::IntArrayRef sizes, const char* name = "");

// True when `t` still lies over the zero page (was never given memory).
bool is_deferred(const at::Tensor& t);

// Throws shardplan::Error naming `layer` and `what` when `t` is deferred
// (unless a ReadDeferred lives on this thread).
void check_materialized(const at::Tensor& t, const char* layer, const char* what);

// The bytes of memory `model`'s parameters own: each storage once, those
// over the zero page (deferred, or another pipeline stage's: Pipeline
// releases them) not at all.
int64_t resident_parameter_bytes(const torch::nn::Module& model);

// Gives every deferred parameter of `model` its own memory, in place (the
// same tensor object, so typed members, ties and views of the module stay
// valid), uninitialised: the caller fills it. Returns the names given memory.
std::vector<std::string> materialize_deferred(torch::nn::Module& model);

}  // namespace nn
}  // namespace shardplan
