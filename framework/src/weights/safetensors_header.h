#pragma once
// The safetensors header, parsed and checked without torch (so the fuzzer,
// tests/fuzz/safetensors_header_fuzzer.cpp, links only this file and base/).
// Not installed.
//
// A safetensors file is: 8 bytes little-endian N, N bytes of JSON, then the
// data. The JSON maps each tensor name to {dtype, shape, data_offsets: [begin,
// end]} (offsets relative to the data's start), plus an optional
// "__metadata__" map of strings. Everything a loader later trusts is checked
// here: offsets inside the data, no two tensors' bytes overlapping, bytes
// equal to dtype size x elements, names UTF-8 and unique.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardplan::weights_detail {

// safetensors' own reader refuses headers over 100 MB; so do we, before
// allocating anything for it.
constexpr uint64_t kMaxHeaderBytes = 100u * 1000 * 1000;

struct SafetensorsEntry {
  std::string name;
  std::string dtype;             // "F32", "BF16", ... as in the file
  int64_t element_size = 0;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;   // absolute byte offsets in the file
};

struct SafetensorsHeader {
  uint64_t data_start = 0;       // 8 + header length
  std::vector<SafetensorsEntry> entries;  // in the file's data order
  std::map<std::string, std::string> metadata;
};

// Bytes per element of a safetensors dtype name, or 0 for one we do not read.
int64_t safetensors_dtype_size(const std::string& dtype);

// The header length from the first 8 bytes, checked against the cap and the
// file size. `file` names the file in errors (shardplan::Error, one line).
uint64_t safetensors_header_length(const unsigned char first8[8], uint64_t file_size, const std::string& file);

// Parses and checks `json` (the header's bytes) for a file of `file_size`
// bytes. Throws shardplan::Error naming `file` and the tensor.
SafetensorsHeader parse_safetensors_header(const std::string& json, uint64_t file_size, const std::string& file);

// The header's JSON for `entries`, whose begin/end it sets (relative to the
// data start: the tensors back to back in the given order), space-padded to
// a multiple of 8 bytes so the data that follows is aligned, as Python's
// safetensors writes it.
std::string safetensors_header_json(std::vector<SafetensorsEntry>& entries,
                                    const std::map<std::string, std::string>& metadata);

}  // namespace shardplan::weights_detail
