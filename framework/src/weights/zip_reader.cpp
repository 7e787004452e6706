// Reading a zip's central directory in place (zip_reader.h). Only what
// torch.save's writer (miniz, through PyTorchStreamWriter) produces needs to
// be read, but every offset is checked, since the bytes are untrusted.
#include "weights/zip_reader.h"

#include "shardplan/error.h"

namespace shardplan::weights_detail {

namespace {

constexpr uint32_t kEndOfDirectory = 0x06054b50, kEnd64 = 0x06064b50, kEnd64Locator = 0x07064b50;
constexpr uint32_t kDirectoryEntry = 0x02014b50, kLocalHeader = 0x04034b50;
// Deflate expands at most 1032:1 (RFC 1951's longest match per 2 bits); a
// larger claim is a lie whoever would believe it, reader or inflater.
constexpr uint64_t kMaxDeflateRatio = 1032;

// Bounds-checked little-endian reads over the archive.
struct Bytes {
  const unsigned char* data;
  uint64_t size;
  const std::string& file;

  [[noreturn]] void fail(const std::string& what) const { throw Error("zip file '" + file + "': " + what); }
  void need(uint64_t at, uint64_t n) const {
    if (at > size || n > size - at) fail("truncated or corrupted (a structure runs past the end of the file)");
  }
  uint64_t le(uint64_t at, int n) const {
    need(at, static_cast<uint64_t>(n));
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | data[at + static_cast<uint64_t>(i)];
    return v;
  }
};

// The end-of-central-directory record is in the last 64 KiB + 22 bytes
// (its comment is at most 65535 bytes); searched backwards.
uint64_t find_end(const Bytes& b) {
  if (b.size < 22) b.fail("too short to be a zip archive");
  const uint64_t lowest = b.size > 22 + 65535 ? b.size - 22 - 65535 : 0;
  for (uint64_t at = b.size - 22;; --at) {
    if (b.le(at, 4) == kEndOfDirectory) return at;
    if (at == lowest) break;
  }
  b.fail("no end of central directory: not a zip archive, or truncated");
}

// A field that holds 0xFFFF... is in the zip64 extra field (id 1), in the
// order size, compressed size, offset, each only when its field is full.
void apply_zip64(const Bytes& b, uint64_t extra, uint64_t extra_len, uint64_t* fields[3]) {
  for (uint64_t at = extra; at + 4 <= extra + extra_len;) {
    const uint64_t id = b.le(at, 2), len = b.le(at + 2, 2);
    if (id == 1) {
      uint64_t p = at + 4;
      for (int i = 0; i < 3; ++i) {
        if (*fields[i] != 0xFFFFFFFFu) continue;
        if (p + 8 > at + 4 + len) b.fail("zip64 extra field too short");
        *fields[i] = b.le(p, 8);
        p += 8;
      }
      return;
    }
    at += 4 + len;
  }
}

}  // namespace

std::map<std::string, ZipRecord> read_zip_directory(const unsigned char* data, uint64_t size, const std::string& file) {
  const Bytes b{data, size, file};
  const uint64_t end = find_end(b);
  uint64_t count = b.le(end + 10, 2), dir = b.le(end + 16, 4);
  if (count == 0xFFFF || dir == 0xFFFFFFFFu) {  // zip64: the locator sits just before
    if (end < 20 || b.le(end - 20, 4) != kEnd64Locator) b.fail("zip64 locator missing");
    const uint64_t end64 = b.le(end - 20 + 8, 8);
    if (b.le(end64, 4) != kEnd64) b.fail("zip64 end of central directory missing");
    count = b.le(end64 + 32, 8);
    dir = b.le(end64 + 48, 8);
  }
  std::map<std::string, ZipRecord> records;
  uint64_t at = dir;
  for (uint64_t i = 0; i < count; ++i) {
    if (b.le(at, 4) != kDirectoryEntry) b.fail("corrupted central directory (entry " + std::to_string(i) + ")");
    const uint64_t method = b.le(at + 10, 2), name_len = b.le(at + 28, 2), extra_len = b.le(at + 30, 2),
                   comment_len = b.le(at + 32, 2);
    uint64_t compressed = b.le(at + 20, 4), plain = b.le(at + 24, 4), local = b.le(at + 42, 4);
    b.need(at + 46, name_len + extra_len + comment_len);
    const std::string name(reinterpret_cast<const char*>(data + at + 46), name_len);
    uint64_t* fields[3] = {&plain, &compressed, &local};
    apply_zip64(b, at + 46 + name_len, extra_len, fields);
    if (b.le(local, 4) != kLocalHeader) b.fail("record '" + name + "' has no local header where the directory says");
    const uint64_t offset = local + 30 + b.le(local + 26, 2) + b.le(local + 28, 2);
    b.need(offset, compressed);
    if (method == 0 && compressed != plain) b.fail("record '" + name + "' is stored with two different sizes");
    if (method != 0 && plain / kMaxDeflateRatio > compressed)
      b.fail("record '" + name + "' claims " + std::to_string(plain) + " bytes uncompressed from " +
             std::to_string(compressed) + " compressed, more than deflate can expand to");
    if (!records.emplace(name, ZipRecord{offset, plain, compressed, method == 0}).second)
      b.fail("record '" + name + "' appears twice");
    at += 46 + name_len + extra_len + comment_len;
  }
  return records;
}

}  // namespace shardplan::weights_detail
