#pragma once
// Text to token ids and back for checkpoints people download: Hugging Face's
// tokenizer.json (byte-level BPE: GPT-2, Llama 3, Qwen2 with its NFC; BPE
// with byte fallback and Metaspace: Llama 2, Mistral) and SentencePiece's
// tokenizer.model. Torch-free, so it compiles in seconds and the tools can
// use it without libtorch. Tokenizer files are untrusted: sizes and counts
// are bounded before use, and a file that cannot be used is one
// shardplan::Error line naming the file and what is wrong.
//
// It lives with the example models, not in the framework: turning text into
// ids is the models' concern, tensor parallelism never sees text.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shardplan {
namespace examples {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // UTF-8 text to ids; add_special adds what the file's post-processor says
  // (Llama 3's <|begin_of_text|>; GPT-2 and Qwen2 add nothing). Text that is
  // not UTF-8 is refused.
  virtual std::vector<int64_t> encode(const std::string& text, bool add_special) const = 0;
  // Ids back to text: byte-level, the concatenation of the tokens' bytes,
  // which is UTF-8 whenever the ids came from encode; otherwise as the
  // file's decoders say (Llama 2's: "▁" to spaces, <0xNN> bytes, the first
  // space stripped). Special tokens appear as their text.
  // An id outside the vocabulary is an error naming it.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  // One past the largest id, added tokens included.
  virtual int64_t vocab_size() const = 0;
  // The id of a token's text (e.g. "<|endoftext|>"), or -1.
  virtual int64_t token_to_id(const std::string& token) const = 0;
  // -1 where the file names none.
  virtual int64_t bos_id() const = 0;
  virtual int64_t eos_id() const = 0;
  // The ids generation stops at: eos_id(), or generation_config.json's
  // eos_token_id list (Llama 3 Instruct: <|end_of_text|> and <|eot_id|>).
  virtual std::vector<int64_t> eos_ids() const {
    return eos_id() >= 0 ? std::vector<int64_t>{eos_id()} : std::vector<int64_t>{};
  }
};

// Hugging Face tokenizer.json, BPE (docs/WEIGHTS.md "Tokenizers" lists
// what is read and what is refused by name).
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);
// The same from the file's text; `name` is what errors call the file.
std::unique_ptr<Tokenizer> load_hf_tokenizer_text(const std::string& text, const std::string& name);
// SentencePiece tokenizer.model. add_special adds the model's BOS (as
// Llama 2's and Mistral's tokenizer_config.json do); control pieces such as
// "</s>" written in the text are encoded as text, as SentencePiece does.
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& path);

// A checkpoint directory's tokenizer: tokenizer.json, else tokenizer.model,
// with BOS and EOS as tokenizer_config.json says (add_bos_token,
// add_eos_token, bos_token, eos_token) and generation_config.json
// (bos_token_id, eos_token_id, one id or a list), which wins where both
// name one. Each file is optional; one that is there and wrong is an error
// naming it and the key.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir);

}  // namespace examples
}  // namespace shardplan
