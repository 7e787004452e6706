#pragma once
// What the example driver (train_loop.cpp) does around the steps for text
// generation, and after the last step: the communication totals,
// --save-weights, --dump-logits and --generate. Nothing after the last step
// may lose the training: a failure there says where the model is.
#include <cstdint>
#include <string>

#include "models/train_rank.h"

namespace shardplan {

class DataParallel;

namespace examples {

// Before any rank starts: --generate and --dump-logits need a language
// model and a prompt that fits its context (usage() otherwise).
void check_prompt_options(const Args& a, const ModelHandle& probe, const std::string& program,
                          const std::string& only);

// Before step 1: what --generate allocates (every rank's key/value caches
// for the whole context, and the prompt's logits over the whole vocabulary)
// must fit this machine, or a finished training would end in a failed
// allocation. `ranks_here`: the ranks sharing this machine's memory.
void check_generation_fits(const Args& a, torch::nn::Module& module, int ranks_here);

// After the steps `start` to --steps: the totals and outputs above.
// `minimum`: the model's stated bytes per step (-1: none).
void after_training(const TrainRank& r, const DataParallel& dp, const Optimizer& opt, int start, int64_t minimum);

}  // namespace examples
}  // namespace shardplan
