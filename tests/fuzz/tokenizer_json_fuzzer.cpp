// libFuzzer target: a Hugging Face tokenizer.json
// (examples/models/tokenizer/, load_hf_tokenizer_text). Either it is
// refused with one line of shardplan::Error, or it encodes a varied text
// (whitespace runs, digits, Unicode, an added token's text) and the ids
// lie below vocab_size() and decode: back to that text where the file is
// byte-level without a normalizer (NFC and Llama 2's decoders change it).
#include <cstddef>
#include <cstdint>
#include <string>

#include "models/tokenizer/hf_tokenizer_parts.h"
#include "models/tokenizer/tokenizer.h"
#include "shardplan/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<shardplan::examples::Tokenizer> tok;
  bool round_trip = false;
  try {
    const std::string file(reinterpret_cast<const char*>(data), size);
    tok = shardplan::examples::load_hf_tokenizer_text(file, "tokenizer.json");
    const auto parts = shardplan::examples::tokenizer_detail::read_hf_parts_text(file, "tokenizer.json");
    round_trip = parts.byte_level && !parts.nfc;
  } catch (const shardplan::Error& e) {
    if (std::string(e.what()).find('\n') != std::string::npos) __builtin_trap();
    return 0;
  }
  const std::string text = "Hello,  world!\n\n 123 4567 caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac <|endoftext|>\t x  ";
  for (bool special : {false, true}) {
    const std::vector<int64_t> ids = tok->encode(text, special);
    for (int64_t id : ids)
      if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
    const std::string decoded = tok->decode(ids);
    if (!special && round_trip && decoded != text) __builtin_trap();
  }
  return 0;
}
