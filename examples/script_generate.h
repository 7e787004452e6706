#pragma once
// Greedy next-byte generation through a TorchScript language model
// (train_script's --generate): the module's forward maps token ids [B, T]
// to logits [B, T, V] and keeps no key/value cache, so each new byte runs the
// whole window again. Sharded, every rank runs each forward (the collectives
// inside need them all) and picks the argmax of the same gathered logits.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace torch {
namespace jit {
struct Module;
}
}  // namespace torch

namespace shardplan {

class Communicator;

namespace examples {

struct ScriptGeneration {
  std::string text;  // the new bytes, the prompt not included
  // [new bytes, V]: the logits each byte was the argmax of, for comparing
  // runs more finely than the text (a model trained a few steps writes
  // mostly spaces).
  at::Tensor logits;
};

// The `new_bytes` bytes the module appends to `prompt` greedily. Each
// forward sees at most the last `context` bytes (a longer text is cropped
// from the left, as nanoGPT's generate() does: the model has no positions
// past its context). Runs in eval mode without autograd and restores the
// mode. With `agree`, checks that every rank of it generated the same bytes.
// Throws shardplan::Error for an empty prompt.
ScriptGeneration generate_script(torch::jit::Module& module, const std::string& prompt, int64_t new_bytes,
                                 int64_t context, Communicator* agree = nullptr);

}  // namespace examples
}  // namespace shardplan
