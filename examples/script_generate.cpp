#include "script_generate.h"

#include <torch/script.h>

#include <algorithm>
#include <vector>

#include "models/generate.h"
#include "shardplan/error.h"

namespace shardplan {
namespace examples {

ScriptGeneration generate_script(torch::jit::Module& module, const std::string& prompt, int64_t new_bytes,
                                 int64_t context, Communicator* agree) {
  if (prompt.empty()) throw Error("generate: the prompt is empty; give at least one byte (--prompt TEXT)");
  torch::NoGradGuard no_grad;
  const bool was_training = module.is_training();
  module.eval();
  at::Tensor tokens = encode(prompt);  // [1, T]
  std::vector<at::Tensor> picked_from;
  for (int64_t i = 0; i < new_bytes; ++i) {
    const int64_t length = std::min(tokens.size(1), context);
    const at::Tensor window = tokens.narrow(1, tokens.size(1) - length, length);
    const at::Tensor last = module.forward({window}).toTensor().select(1, length - 1);  // [1, V]
    picked_from.push_back(last);
    tokens = at::cat({tokens, last.argmax(-1, /*keepdim=*/true)}, 1);
  }
  module.train(was_training);
  const at::Tensor fresh = tokens.narrow(1, static_cast<int64_t>(prompt.size()), new_bytes);
  if (agree) check_same_tokens(fresh, *agree);
  return {decode(fresh), at::cat(picked_from)};
}

}  // namespace examples
}  // namespace shardplan
