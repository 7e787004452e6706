// libFuzzer target: GPT-2's config.json beside downloaded weights, read by
// the gpt2 example (examples/models/hf_config_gpt2.cpp). The input is the
// file's text. Either it is refused with shardplan::Error (one line), or
// every value it gives is a number that reads back and the sizes are at
// least 1.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "models/hf_config_gpt2.h"
#include "shardplan/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardplan::examples::Overrides out;
  try {
    out = shardplan::examples::read_gpt2_config_text(std::string(reinterpret_cast<const char*>(data), size),
                                                      "config.json");
  } catch (const shardplan::Error& e) {
    if (std::string(e.what()).find('\n') != std::string::npos) __builtin_trap();
    return 0;
  }
  for (const auto& kv : out) {
    char* end = nullptr;
    const double v = std::strtod(kv.second.c_str(), &end);
    if (kv.second.empty() || *end != '\0' || !(v > 0)) __builtin_trap();
  }
  return 0;
}
