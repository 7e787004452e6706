// libFuzzer target: a torch.save file's zip directory is read from files
// that may be truncated, corrupted or hostile. The input is a whole file.
// Either it is refused with shardplan::Error, or every record lies inside
// the file, a stored one holds exactly the bytes it claims, and a compressed
// one claims no more than deflate can expand its bytes to: what
// torch_zip_source.cpp then trusts when it slices the mapping.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "shardplan/error.h"
#include "weights/zip_reader.h"

namespace wd = shardplan::weights_detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, wd::ZipRecord> records;
  try {
    records = wd::read_zip_directory(data, size, "fuzz.bin");
  } catch (const shardplan::Error&) {
    return 0;
  }
  for (const auto& r : records) {
    const wd::ZipRecord& z = r.second;
    if (z.offset > size || z.compressed > size - z.offset) __builtin_trap();
    if (z.stored && z.size != z.compressed) __builtin_trap();
    if (!z.stored && z.size / 1032 > z.compressed) __builtin_trap();
  }
  return 0;
}
