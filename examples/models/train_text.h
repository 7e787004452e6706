#pragma once
// Text in and out of the training driver's --generate and --dump-logits:
// the prompt's token ids and the samples' text, through a checkpoint
// directory's tokenizer (models/tokenizer/tokenizer.h) when there is one,
// else a byte per token as the byte-level corpus has it.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "models/train_args.h"

namespace shardplan {
namespace examples {

// Before any rank starts and any weight is read: loads --tokenizer (or the
// --load-weights directory's) into a.tokenizer, and checks that its
// vocabulary (max id + 1, added tokens included) fits the model's
// `model_vocab` (config.json's vocab_size, which Hugging Face pads up: a
// smaller tokenizer is fine). Throws shardplan::Error naming both files.
void load_prompt_tokenizer(Args& a, int64_t model_vocab);

// --prompt as token ids [1, T].
at::Tensor prompt_tokens(const Args& a);
int64_t prompt_length(const Args& a);

// What generation stops at: the tokenizer's EOS ids (none without one).
std::vector<int64_t> stop_ids(const Args& a);

// One row of generated ids as the line prints it: up to its first stop id,
// decoded and escaped (printable / printable_utf8, models/generate.h).
std::string sample_text(const Args& a, const at::Tensor& row, bool* stopped, int64_t* length);

}  // namespace examples
}  // namespace shardplan
