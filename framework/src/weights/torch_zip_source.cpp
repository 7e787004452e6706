// torch.save files (the zip format PyTorch writes since 1.6) read in place.
//
// libtorch 1.13's torch::pickle_load reads this format, but not what Python
// saves as a state dict: its Unpickler turns collections.OrderedDict (which
// model.state_dict() is) into None, and it copies every storage into memory.
// So the archive's directory is read by zip_reader.cpp, data.pkl by
// pickle_reader.cpp, and each tensor (dtype from its storage's class, shape,
// strides, storage offset) is pointed into the mapped record
// "<archive>/data/<key>", which torch.save writes stored (uncompressed) and
// 64-byte aligned, after checking it stays inside that record.
#include <ATen/ATen.h>

#include <cstring>
#include <map>

#include "shardplan/error.h"
#include "weights/pickle_reader.h"
#include "weights/weights_internal.h"
#include "weights/zip_reader.h"

namespace shardplan::weights_detail {

namespace {

[[noreturn]] void fail_torch_save(const std::string& path, const std::string& what) {
  throw Error("torch.save file '" + path + "': " + what);
}

void check_format(const MappedFile& f) {
  const unsigned char* d = f.data();
  if (f.size() >= 4 && std::memcmp(d, "PK\x03\x04", 4) == 0) return;
  if (f.size() >= 2 && d[0] == 0x80)
    fail_torch_save(f.path(), "is in the legacy (non-zip) torch.save format, which cannot be read in place; re-save it with "
                              "torch.save(state_dict, path) from PyTorch >= 1.6 (the default zip format), or as safetensors");
  fail_torch_save(f.path(), "is neither a torch.save zip file nor a safetensors file (give safetensors files a .safetensors name)");
}

// The archive's folder: torch.save names every record "<folder>/...".
std::string archive_prefix(const std::map<std::string, ZipRecord>& records, const std::string& path) {
  for (const auto& r : records) {
    const std::string& n = r.first;
    if (n.size() > 9 && n.compare(n.size() - 9, 9, "/data.pkl") == 0 && n.find('/') == n.size() - 9)
      return n.substr(0, n.size() - 8);
  }
  fail_torch_save(path, "has no data.pkl: a zip file, but not one torch.save wrote");
}

at::ScalarType storage_dtype(const std::string& type, const std::string& path, const std::string& name) {
  static const std::map<std::string, at::ScalarType> types = {
      {"DoubleStorage", at::kDouble}, {"FloatStorage", at::kFloat}, {"HalfStorage", at::kHalf},
      {"BFloat16Storage", at::kBFloat16}, {"LongStorage", at::kLong}, {"IntStorage", at::kInt},
      {"ShortStorage", at::kShort}, {"CharStorage", at::kChar}, {"ByteStorage", at::kByte},
      {"BoolStorage", at::kBool}};
  auto it = types.find(type);
  if (it == types.end()) fail_torch_save(path, "tensor '" + escaped(name) + "' has storage type '" + escaped(type) + "', which is not read");
  return it->second;
}

// Where a tensor's elements lie, checked against its record.
SourceTensor describe(const PickledTensor& p, const ZipRecord& rec, std::shared_ptr<MappedFile> file) {
  const std::string& path = file->path();
  const std::string where = "tensor '" + escaped(p.name) + "'";
  SourceTensor s;
  s.name = p.name;
  s.dtype = storage_dtype(p.storage_type, path, p.name);
  if (s.dtype == at::kBool) s.dtype = at::kByte, s.is_bool = true;
  s.shape = p.shape;
  s.strides = p.strides;
  const auto esize = static_cast<unsigned __int128>(c10::elementSize(s.dtype));
  if (p.storage_offset < 0) fail_torch_save(path, where + " has a negative storage offset");
  unsigned __int128 last = static_cast<unsigned __int128>(p.storage_offset);
  bool empty = false;
  for (size_t i = 0; i < s.shape.size(); ++i) {
    if (s.shape[i] < 0 || s.strides[i] < 0) fail_torch_save(path, where + " has a negative size or stride");
    if (s.shape[i] == 0) empty = true;
    else last += static_cast<unsigned __int128>(s.shape[i] - 1) * static_cast<unsigned __int128>(s.strides[i]);
  }
  const unsigned __int128 need = empty ? 0 : (last + 1) * esize;
  if (need > rec.size)
    fail_torch_save(path, where + " reaches past its storage record (" + std::to_string(rec.size) + " bytes)");
  s.data = file->data() + rec.offset + (empty ? 0 : static_cast<uint64_t>(p.storage_offset) * static_cast<uint64_t>(esize));
  s.begin = rec.offset;
  s.end = rec.offset + static_cast<uint64_t>(need);
  s.file = std::move(file);
  return s;
}

// torch.save writes "little" or "big", stored. Only the stored bytes are
// looked at: a compressed record is refused for what it is, not misread as
// some other byte order.
void check_byteorder(const std::map<std::string, ZipRecord>& records, const std::string& prefix, const MappedFile& f) {
  auto bo = records.find(prefix + "byteorder");
  if (bo == records.end()) return;
  if (!bo->second.stored)
    fail_torch_save(f.path(), "record 'byteorder' is compressed (deflated); torch.save stores its records, and "
                              "compressed records are not read (re-save it with torch.save)");
  const std::string order(reinterpret_cast<const char*>(f.data() + bo->second.offset), bo->second.size);
  if (order == "little") return;
  if (order == "big") fail_torch_save(f.path(), "was written on a big-endian machine; only little-endian files are read");
  fail_torch_save(f.path(), "record 'byteorder' holds neither \"little\" nor \"big\"");
}

}  // namespace

std::vector<SourceTensor> open_torch_zip(const std::string& path) {
  auto file = std::make_shared<MappedFile>(path);
  check_format(*file);
  const auto records = read_zip_directory(file->data(), file->size(), path);
  const std::string prefix = archive_prefix(records, path);
  check_byteorder(records, prefix, *file);
  const ZipRecord& pkl = records.at(prefix + "data.pkl");
  if (!pkl.stored) fail_torch_save(path, "data.pkl is compressed (deflated); torch.save stores it, and compressed records are not read");
  const auto tensors =
      read_pickled_state_dict(std::string(reinterpret_cast<const char*>(file->data() + pkl.offset), pkl.size), path);
  std::vector<SourceTensor> out;
  for (const auto& t : tensors) {
    auto it = records.find(prefix + "data/" + t.storage_key);
    if (it == records.end()) fail_torch_save(path, "tensor '" + escaped(t.name) + "' is in storage '" + escaped(t.storage_key) + "', which the archive lacks");
    if (!it->second.stored) fail_torch_save(path, "tensor '" + escaped(t.name) + "': its storage is compressed; torch.save stores storages");
    out.push_back(describe(t, it->second, file));
  }
  return out;
}

}  // namespace shardplan::weights_detail
