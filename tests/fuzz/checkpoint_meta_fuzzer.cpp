// libFuzzer target: checkpoint metadata is read from disk that may be
// truncated, corrupted or hostile. Any bytes either parse into metadata that a
// loader can trust (pieces partition every tensor, sizes agree, file names
// stay inside the checkpoint) or throw shardplan::Error — never crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "shardplan/checkpoint_meta.h"
#include "shardplan/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  shardplan::ckpt::Meta meta;
  try {
    meta = shardplan::ckpt::parse_meta(text, "fuzz/metadata.yaml");
  } catch (const shardplan::Error&) {
    return 0;
  }
  // What parsed must write back to an equal description.
  const std::string again = shardplan::ckpt::to_yaml(meta);
  const auto meta2 = shardplan::ckpt::parse_meta(again, "rewritten.yaml");
  if (shardplan::ckpt::to_yaml(meta2) != again) __builtin_trap();
  for (const auto& t : meta.tensors)
    for (const auto& p : t.pieces)
      if (p.file.find('/') != std::string::npos) __builtin_trap();
  return 0;
}
