#pragma once
// The central directory of a zip archive, enough to find the records of a
// torch.save file in place: PyTorch writes every record stored (not
// compressed) and 64-byte aligned, so a record's bytes can be memory-mapped
// and sliced where they lie. Torch-free; not installed.
#include <cstdint>
#include <map>
#include <string>

namespace shardplan::weights_detail {

struct ZipRecord {
  uint64_t offset = 0;      // of the record's bytes in the archive
  uint64_t size = 0;        // uncompressed, as the directory claims
  uint64_t compressed = 0;  // the bytes at `offset` (= size when stored)
  bool stored = true;       // compression method 0
};

// Every record of the archive `data` (`size` bytes) by name, each checked to
// lie inside it; a compressed record's claimed uncompressed size is bounded
// by what deflate can expand its bytes to, so no claim exceeds the file's
// worth. Throws shardplan::Error naming `file` for anything that is
// not a readable zip (zip64 included).
std::map<std::string, ZipRecord> read_zip_directory(const unsigned char* data, uint64_t size, const std::string& file);

}  // namespace shardplan::weights_detail
