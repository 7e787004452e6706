// torch.save files (the zip format PyTorch writes since 1.6) read in place.
//
// libtorch's torch::pickle_load reads these files too, but it copies every
// storage into memory first. Here the archive's directory is read by
// zip_reader.cpp, and libtorch's Unpickler runs over data.pkl with a
// read_record that hands out pointers into the file's mapping instead of
// copies; the tensors it rebuilds say dtype, shape, strides and storage
// offset, each checked to stay inside its record. Storages are records
// "<archive>/data/<key>", written stored (uncompressed) and 64-byte aligned.
#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <cstring>
#include <map>

#include "shardplan/error.h"
#include "weights/weights_internal.h"
#include "weights/zip_reader.h"

namespace shardplan::weights_detail {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("torch.save file '" + path + "': " + what);
}

void check_format(const MappedFile& f) {
  const unsigned char* d = f.data();
  if (f.size() >= 4 && std::memcmp(d, "PK\x03\x04", 4) == 0) return;
  if (f.size() >= 2 && d[0] == 0x80)
    fail(f.path(), "is in the legacy (non-zip) torch.save format, which cannot be read in place; re-save it with "
                   "torch.save(state_dict, path) from PyTorch >= 1.6 (the default zip format), or as safetensors");
  fail(f.path(), "is neither a torch.save zip file nor a safetensors file (give safetensors files a .safetensors name)");
}

// The archive's folder: torch.save names every record "<folder>/...".
std::string archive_prefix(const std::map<std::string, ZipRecord>& records, const std::string& path) {
  for (const auto& r : records) {
    const std::string& n = r.first;
    if (n.size() > 9 && n.compare(n.size() - 9, 9, "/data.pkl") == 0 && n.find('/') == n.size() - 9)
      return n.substr(0, n.size() - 8);
  }
  fail(path, "has no data.pkl: a zip file, but not one torch.save wrote");
}

// Where a rebuilt tensor's elements lie, checked against its record.
SourceTensor describe(const std::string& name, const at::Tensor& t, const ZipRecord& rec,
                      std::shared_ptr<MappedFile> file) {
  const std::string where = "tensor '" + name + "'";
  SourceTensor s;
  s.name = name;
  s.dtype = t.scalar_type();
  if (s.dtype == at::kBool) s.dtype = at::kByte, s.is_bool = true;
  s.shape = t.sizes().vec();
  s.strides = t.strides().vec();
  const auto esize = static_cast<unsigned __int128>(t.element_size());
  unsigned __int128 last = static_cast<unsigned __int128>(t.storage_offset());
  bool empty = false;
  for (size_t i = 0; i < s.shape.size(); ++i) {
    if (s.shape[i] < 0 || s.strides[i] < 0) fail(file->path(), where + " has a negative size or stride");
    if (s.shape[i] == 0) empty = true;
    else last += static_cast<unsigned __int128>(s.shape[i] - 1) * static_cast<unsigned __int128>(s.strides[i]);
  }
  if (t.storage_offset() < 0) fail(file->path(), where + " has a negative storage offset");
  const unsigned __int128 need = empty ? 0 : (last + 1) * esize;
  if (need > rec.size)
    fail(file->path(), where + " reaches past its storage record (" + std::to_string(rec.size) + " bytes)");
  s.data = file->data() + rec.offset + static_cast<uint64_t>(t.storage_offset()) * t.element_size();
  s.begin = rec.offset;
  s.end = rec.offset + static_cast<uint64_t>(need);
  s.file = std::move(file);
  return s;
}

}  // namespace

std::vector<SourceTensor> open_torch_zip(const std::string& path) {
  auto file = std::make_shared<MappedFile>(path);
  check_format(*file);
  const auto records = read_zip_directory(file->data(), file->size(), path);
  const std::string prefix = archive_prefix(records, path);
  auto bo = records.find(prefix + "byteorder");
  if (bo != records.end() && std::string(reinterpret_cast<const char*>(file->data() + bo->second.offset),
                                         bo->second.size) != "little")
    fail(path, "was written on a big-endian machine; only little-endian files are read");
  const ZipRecord& pkl = records.at(prefix + "data.pkl");
  if (!pkl.stored) fail(path, "data.pkl is compressed; torch.save stores it");
  // Which record each storage pointer came from, to check tensors against.
  std::map<const void*, ZipRecord> handed_out;
  auto read_record = [&](const std::string& key) {
    auto it = records.find(prefix + "data/" + key);
    if (it == records.end()) fail(path, "data.pkl names storage '" + key + "', which the archive lacks");
    if (!it->second.stored) fail(path, "storage '" + key + "' is compressed; torch.save stores storages");
    void* p = const_cast<unsigned char*>(file->data() + it->second.offset);
    handed_out[p] = it->second;
    return at::DataPtr(p, p, [](void*) {}, at::Device(at::kCPU));
  };
  uint64_t pos = 0;
  auto reader = [&](char* buf, size_t n) -> size_t {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(n, pkl.size - pos));
    std::memcpy(buf, file->data() + pkl.offset + pos, k);
    pos += k;
    return k;
  };
  // Type tags of typed containers (libtorch's pickler writes Dict[str,
  // Tensor]) are types; any class is a model object, not a state dict.
  auto refuse_class = [&](const c10::QualifiedName& q) -> c10::StrongTypePtr {
    try {
      return c10::StrongTypePtr(nullptr, torch::jit::Unpickler::defaultTypeParser(q.qualifiedName()));
    } catch (const std::exception&) {
    }
    fail(path, "pickles an object of class '" + q.qualifiedName() +
                   "' (a whole model or TorchScript module?), not a state dict of tensors; save model.state_dict()");
  };
  c10::IValue value;
  try {
    torch::jit::Unpickler unpickler(reader, refuse_class, nullptr, read_record, at::Device(at::kCPU));
    value = unpickler.parse_ivalue();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    msg = msg.substr(0, msg.find('\n'));
    fail(path, "data.pkl cannot be read as a state dict (" + msg + ")");
  }
  if (!value.isGenericDict()) fail(path, "holds a " + value.tagKind() + ", not a state dict (a dict of tensors)");
  std::vector<SourceTensor> out;
  for (const auto& kv : value.toGenericDict()) {
    if (!kv.key().isString()) fail(path, "is a dict whose keys are not all names, not a state dict");
    const std::string name = kv.key().toStringRef();
    if (!kv.value().isTensor()) fail(path, "entry '" + name + "' is a " + kv.value().tagKind() + ", not a tensor");
    const at::Tensor t = kv.value().toTensor();
    if (t.numel() == 0) {
      out.push_back(describe(name, t, ZipRecord{0, 0, true}, file));
      continue;
    }
    auto rec = handed_out.find(t.storage().data());
    if (rec == handed_out.end()) fail(path, "tensor '" + name + "' has a storage that is not in the archive");
    out.push_back(describe(name, t, rec->second, file));
  }
  return out;
}

}  // namespace shardplan::weights_detail
