// libFuzzer target: a Hugging Face config.json beside downloaded weights,
// read by the llama example (examples/models/hf_config.cpp). The input is
// the file's text. Either it is refused with shardplan::Error (one line),
// or every value it gives is a number that reads back, but `family`, a
// model_type of the table.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "models/hf_config.h"
#include "shardplan/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardplan::examples::Overrides out;
  try {
    out = shardplan::examples::read_hf_config_text(std::string(reinterpret_cast<const char*>(data), size),
                                                    "config.json", "llama");
  } catch (const shardplan::Error& e) {
    if (std::string(e.what()).find('\n') != std::string::npos) __builtin_trap();
    return 0;
  }
  for (const auto& kv : out) {
    if (kv.first == "family") {
      if (shardplan::examples::hf_example_for(kv.second) != "llama") __builtin_trap();
      continue;
    }
    char* end = nullptr;
    std::strtod(kv.second.c_str(), &end);
    if (kv.second.empty() || *end != '\0') __builtin_trap();
  }
  return 0;
}
