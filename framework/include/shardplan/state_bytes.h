#pragma once
// What one rank holds of a model's training state, measured over the live
// tensors (each storage once, whatever views share it), for checking ZeRO's
// promises against theory (benchmarks/zero_memory). A storage counts under
// the first kind that reaches it, in the order below.
#include <cstdint>

namespace shardplan {

class Optimizer;

struct StateBytes {
  int64_t params = 0;     // the model's parameters (this rank's TP shards)
  // Every gradient buffer: the model's .grad, DataParallel's flat buckets
  // (ZeRO-2: only those still reducing), ZeRO's reduced slices and what
  // the inner optimizer's tensors hold in .grad.
  int64_t grads = 0;
  int64_t optimizer = 0;  // the inner optimizer's per-parameter state (moments, momentum)
  // The inner optimizer's own parameters where they are not the model's:
  // ZeRO-1/2's slice of the parameters (DeepSpeed's fp32 partition),
  // mixed precision's masters.
  int64_t copies = 0;
  int64_t total() const { return params + grads + optimizer + copies; }
};

// Local, no communication; any time (between steps, after backward).
StateBytes state_bytes(Optimizer& optimizer);

}  // namespace shardplan
