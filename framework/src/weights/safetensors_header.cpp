// Parsing and checking a safetensors header (safetensors_header.h).
#include "weights/safetensors_header.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

#include "base/utf8.h"
#include "shardplan/error.h"

namespace shardplan::weights_detail {

using nlohmann::json;

// A file's name in a message on one line: control bytes, and every byte
// outside ASCII of a name that is not UTF-8, as \xNN; long names cut.
std::string escaped(const std::string& name) {
  static const char* hex = "0123456789abcdef";
  const bool utf8 = detail::valid_utf8(name);
  std::string out;
  for (unsigned char c : name.substr(0, 200)) {
    if (c >= 0x20 && c != 0x7f && (c < 0x80 || utf8)) out += static_cast<char>(c);
    else out += std::string("\\x") + hex[c >> 4] + hex[c & 15];
  }
  return name.size() > 200 ? out + "..." : out;
}

namespace {

std::string printable(const std::string& name) { return "'" + escaped(name) + "'"; }

[[noreturn]] void fail_safetensors(const std::string& file, const std::string& what) {
  throw Error("safetensors file '" + file + "': " + what);
}

// A JSON unsigned integer, or an error naming the field.
uint64_t as_uint(const json& v, const std::string& file, const std::string& what) {
  if (!v.is_number_unsigned()) {
    if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<uint64_t>();
    fail_safetensors(file, what + " is not a non-negative integer");
  }
  return v.get<uint64_t>();
}

// Names must be unique: nlohmann keeps one of two equal keys silently, so
// the top-level keys are collected while parsing.
json parse_checking_duplicates(const std::string& text, const std::string& file) {
  std::set<std::string> seen;
  std::string duplicate;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && duplicate.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!seen.insert(key).second) duplicate = key;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, callback);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers too large
    const std::string msg = e.what();
    if (msg.find("UTF-8") != std::string::npos || msg.find("surrogate") != std::string::npos)
      fail_safetensors(file, "header has a name or string that is not UTF-8 (" + msg + ")");
    fail_safetensors(file, "header is not valid JSON (" + msg + ")");
  }
  if (!duplicate.empty()) fail_safetensors(file, "header names tensor " + printable(duplicate) + " twice");
  return j;
}

SafetensorsEntry parse_entry(const std::string& name, const json& v, uint64_t data_start, uint64_t file_size,
                             const std::string& file) {
  const std::string where = "tensor " + printable(name);
  if (!detail::valid_utf8(name)) fail_safetensors(file, where + ": name is not UTF-8");
  if (!v.is_object()) fail_safetensors(file, where + ": entry is not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) fail_safetensors(file, where + ": no '" + key + "'");
  if (!v["dtype"].is_string()) fail_safetensors(file, where + ": dtype is not a string");
  SafetensorsEntry e;
  e.name = name;
  e.dtype = v["dtype"].get<std::string>();
  e.element_size = safetensors_dtype_size(e.dtype);
  if (e.element_size == 0)
    fail_safetensors(file, where + ": unknown or unsupported dtype " + printable(e.dtype) +
                               " (read: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)");
  if (!v["shape"].is_array()) fail_safetensors(file, where + ": shape is not a list");
  // Elements counted with overflow checks: a shape is only trusted once its
  // byte count matches the offsets, which are inside the file.
  uint64_t elements = 1;
  bool overflow = false;
  for (const auto& d : v["shape"]) {
    const uint64_t n = as_uint(d, file, where + ": a shape entry");
    if (n > static_cast<uint64_t>(INT64_MAX)) fail_safetensors(file, where + ": shape entry too large");
    e.shape.push_back(static_cast<int64_t>(n));
    if (n != 0 && elements > UINT64_MAX / n) overflow = true;
    else elements *= n;
  }
  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2) fail_safetensors(file, where + ": data_offsets is not a list of two integers");
  const uint64_t begin = as_uint(off[0], file, where + ": data_offsets[0]");
  const uint64_t end = as_uint(off[1], file, where + ": data_offsets[1]");
  const uint64_t data_size = file_size - data_start;
  if (begin > end || end > data_size)
    fail_safetensors(file, where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                               "] are outside the data (" + std::to_string(data_size) + " bytes)");
  const uint64_t esize = static_cast<uint64_t>(e.element_size);
  if (overflow || elements > UINT64_MAX / esize || elements * esize != end - begin)
    fail_safetensors(file, where + ": " + std::to_string(end - begin) + " bytes do not hold " + e.dtype + " of shape " +
                               v["shape"].dump());
  e.begin = data_start + begin;
  e.end = data_start + end;
  return e;
}

}  // namespace

int64_t safetensors_dtype_size(const std::string& dtype) {
  static const std::map<std::string, int64_t> sizes = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2},
                                                       {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
                                                       {"U8", 1},  {"BOOL", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

uint64_t safetensors_header_length(const unsigned char first8[8], uint64_t file_size, const std::string& file) {
  if (file_size < 8) fail_safetensors(file, "truncated: " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | first8[i];
  if (n > kMaxHeaderBytes)
    fail_safetensors(file, "header length " + std::to_string(n) + " is over the cap of " + std::to_string(kMaxHeaderBytes) +
                               " bytes (not a safetensors file, or a corrupted one)");
  if (n > file_size - 8)
    fail_safetensors(file, "header length " + std::to_string(n) + " runs past the end of the file (" +
                               std::to_string(file_size) + " bytes): truncated?");
  return n;
}

SafetensorsHeader parse_safetensors_header(const std::string& text, uint64_t file_size, const std::string& file) {
  SafetensorsHeader h;
  h.data_start = 8 + text.size();
  if (h.data_start > file_size) fail_safetensors(file, "header runs past the end of the file");
  const json j = parse_checking_duplicates(text, file);
  if (!j.is_object()) fail_safetensors(file, "header is not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) fail_safetensors(file, "__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) fail_safetensors(file, "__metadata__ value " + printable(m.key()) + " is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    h.entries.push_back(parse_entry(it.key(), it.value(), h.data_start, file_size, file));
  }
  std::sort(h.entries.begin(), h.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Sorted by start, two tensors overlap exactly when one starts before the
  // previous one ends (empty tensors overlap nothing).
  const SafetensorsEntry* last = nullptr;
  for (const auto& e : h.entries) {
    if (e.begin == e.end) continue;
    if (last && e.begin < last->end)
      fail_safetensors(file, "tensors " + printable(last->name) + " and " + printable(e.name) + " overlap in the data (bytes " +
                                 std::to_string(e.begin - h.data_start) + " to " + std::to_string(last->end - h.data_start) + ")");
    last = &e;
  }
  return h;
}

std::string safetensors_header_json(std::vector<SafetensorsEntry>& entries,
                                    const std::map<std::string, std::string>& metadata) {
  json j = json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (auto& e : entries) {
    uint64_t n = static_cast<uint64_t>(e.element_size);
    for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
    e.begin = offset;
    e.end = offset + n;
    offset = e.end;
    j[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = j.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace shardplan::weights_detail
