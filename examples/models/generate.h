#pragma once
// Text generation with the example GPT or Llama (any CausalLM, models/model.h)
// under tensor parallelism, the way
// Megatron's and HF's generate() do it: the prompt goes through once
// (prefill) filling a key/value cache per block, then one token per step
// through the cache (incremental decoding), greedy or sampled with a
// temperature and top-k.
//
// Under plans/gpt.yaml every rank runs the same steps: each attention
// computes and caches only this rank's heads (per-rank cache bytes = 1/N),
// the vocab-parallel head's logits are gathered (V/N values per rank and
// token), and every rank samples from the same logits with a generator in the
// same state (the RNG tracker's replicated stream), so every rank picks the
// same token without a broadcast. One all-reduce at the end checks that.
//
// Under sequence parallelism (plans/gpt_sp.yaml) the prompt is prefilled with
// the sequence split when its length divides over the sequence-parallel
// ranks, and the rest (one token per step, or a prompt that does not divide)
// runs with the sequence whole (shardplan::WholeSequence, mappings.h): the
// same tokens as plans/gpt.yaml, and as one process.
//
// The cache does not slide: prompt + new tokens must fit the context (the
// position embedding has no rows past it), else a clear error before any
// work, as HF's GPT-2 does.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace at {
class Generator;
}

namespace shardplan {

class Communicator;
namespace nn {
class LinearImpl;
}

namespace examples {

class CausalLM;

struct GenerateOptions {
  int64_t new_tokens = 0;
  double temperature = 0;  // 0: greedy (argmax)
  int64_t top_k = 0;       // sample among the k likeliest; 0: all; 1: greedy
  // The ranks the model's sequence-parallel region splits the sequence over
  // (the plan's sequence axis); 1: no sequence parallelism.
  int64_t sequence_parts = 1;
  // Token ids that end a sample (a tokenizer's EOS ids; empty: none). A row
  // that picks one keeps it for the steps after (as HF pads with it), and
  // generation ends when every row has picked one. Every rank picks the
  // same tokens, so every rank stops at the same step without a message.
  std::vector<int64_t> stop_ids;
};

struct Generation {
  // [B, N] long, the prompt not included: N = new_tokens, or fewer where
  // every row reached one of stop_ids (see sample_length).
  at::Tensor tokens;
  double seconds = 0;         // prefill and decoding, wall clock
  // The two phases apart (they are bound differently: the prefill is B x T
  // positions at once, a decoding step B positions through the cache):
  // the prompt's forward and the first token's pick, then the rest.
  double prefill_seconds = 0;
  int64_t prompt_tokens = 0;  // B x T
  int64_t cache_bytes = 0;    // this rank's key/value caches, all blocks
  double tokens_per_second() const;  // generated tokens (all B rows) per second
  double prefill_tokens_per_second() const;  // prompt positions (B x T) per second of prefill
  double decode_tokens_per_second() const;   // B x (new_tokens - 1) per second after the prefill
};

// Throws shardplan::Error for an empty prompt, a prompt longer than the
// context, prompt + new tokens past it, or bad sampling options: what
// generate() checks first, for a driver to check before training.
void check_generation(const CausalLM& model, int64_t prompt_tokens, const GenerateOptions& options);

// prompt [B, T] long, the same on every rank. `gen` must be in the same state
// on every rank (e.g. RngTracker::replicated()). With `agree`, checks after
// the last step that every rank of it generated the same tokens (throws
// otherwise). Runs in eval mode without autograd; restores the mode.
Generation generate(CausalLM& model, const at::Tensor& prompt, const GenerateOptions& options, at::Generator& gen,
                    Communicator* agree = nullptr);

// Throws shardplan::Error unless every rank of `comm` holds the same
// `tokens` ([B, N] long, the same shape on every rank): one all-reduce.
void check_same_tokens(const at::Tensor& tokens, Communicator& comm);

// `logits` of the LM head `head` with the vocabulary whole: gathered over
// the head's group when the plan left its output split (a vocab-parallel
// head), as prefill and every decoding step need them.
at::Tensor vocab_whole(const shardplan::nn::LinearImpl& head, const at::Tensor& logits);

// The next token [B] from next-token logits [B, V]: argmax when greedy, else
// a draw from softmax(logits / temperature) over the top-k.
at::Tensor next_token(const at::Tensor& logits, const GenerateOptions& options, at::Generator& gen);

// The tokens of a row of Generation::tokens before its first stop id, and
// whether it has one.
int64_t sample_length(const at::Tensor& row, const std::vector<int64_t>& stop_ids, bool* stopped);

// Bytes <-> text for the byte-level corpus; printable() escapes what a
// terminal line would not show ("\n", "\x07").
at::Tensor encode(const std::string& text);
std::string decode(const at::Tensor& tokens);
std::string printable(const std::string& text);
// The same, except that UTF-8 characters past ASCII are kept as they are
// (a tokenizer's text); bytes that are not UTF-8 are escaped.
std::string printable_utf8(const std::string& text);

}  // namespace examples
}  // namespace shardplan
