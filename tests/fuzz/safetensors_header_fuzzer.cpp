// libFuzzer target: a safetensors file's header is read from files that may
// be truncated, corrupted or hostile. The input is a whole file. Either it
// is refused with shardplan::Error, or every tensor it describes lies inside
// the data, holds exactly dtype size x elements bytes and overlaps no other:
// what load_weights then trusts when it maps the file.
#include <cstddef>
#include <cstdint>
#include <string>

#include "shardplan/error.h"
#include "weights/safetensors_header.h"

namespace wd = shardplan::weights_detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  wd::SafetensorsHeader h;
  try {
    const uint64_t n = wd::safetensors_header_length(data, size, "fuzz.safetensors");
    h = wd::parse_safetensors_header(std::string(reinterpret_cast<const char*>(data) + 8, n), size, "fuzz.safetensors");
  } catch (const shardplan::Error&) {
    return 0;
  }
  uint64_t last_end = h.data_start;
  for (const auto& e : h.entries) {
    if (e.begin < h.data_start || e.begin > e.end || e.end > size) __builtin_trap();
    unsigned __int128 bytes = static_cast<unsigned __int128>(e.element_size);
    for (int64_t d : e.shape) bytes *= static_cast<unsigned __int128>(d);
    if (bytes != e.end - e.begin) __builtin_trap();
    if (e.begin != e.end) {
      if (e.begin < last_end) __builtin_trap();  // entries are sorted by offset
      last_end = e.end;
    }
  }
  // What parsed writes back to a header that parses again.
  auto entries = h.entries;
  const std::string json = wd::safetensors_header_json(entries, h.metadata);
  uint64_t data_bytes = entries.empty() ? 0 : entries.back().end;
  try {
    wd::parse_safetensors_header(json, 8 + json.size() + data_bytes, "rewritten.safetensors");
  } catch (const shardplan::Error&) {
    __builtin_trap();
  }
  return 0;
}
