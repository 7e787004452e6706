// libFuzzer target: a Hugging Face tokenizer.json
// (examples/models/tokenizer/, load_hf_tokenizer_text). Either it is
// refused with one line of shardplan::Error, or it encodes a varied text
// (whitespace runs, digits, Unicode, an added token's text) and the ids
// decode back to that text and lie below vocab_size().
#include <cstddef>
#include <cstdint>
#include <string>

#include "models/tokenizer/tokenizer.h"
#include "shardplan/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<shardplan::examples::Tokenizer> tok;
  try {
    tok = shardplan::examples::load_hf_tokenizer_text(std::string(reinterpret_cast<const char*>(data), size),
                                                      "tokenizer.json");
  } catch (const shardplan::Error& e) {
    if (std::string(e.what()).find('\n') != std::string::npos) __builtin_trap();
    return 0;
  }
  const std::string text = "Hello,  world!\n\n 123 4567 caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac <|endoftext|>\t x  ";
  for (bool special : {false, true}) {
    const std::vector<int64_t> ids = tok->encode(text, special);
    for (int64_t id : ids)
      if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
    if (!special && tok->decode(ids) != text) __builtin_trap();
  }
  return 0;
}
