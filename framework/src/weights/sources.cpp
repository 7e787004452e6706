// Finding and opening weights files (weights_internal.h): memory maps,
// safetensors files, and directories with an index. torch.save zip files
// are in torch_zip_source.cpp.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "shardplan/error.h"
#include "shardplan/weights.h"
#include "weights/safetensors_header.h"
#include "weights/weights_internal.h"

namespace shardplan::weights_detail {

namespace fs = std::filesystem;

namespace {

// A read-only descriptor of the regular file `path`, or an error naming it as
// `what`. O_NONBLOCK: opening a named pipe for reading would otherwise wait
// for a writer that never comes, before fstat could tell it is one.
int open_regular(const std::string& path, const std::string& what, uint64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error("cannot open " + what + " '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(what + " '" + path + "' is not a regular file (a pipe, device or directory is not read)");
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

// The whole of a small regular file (an index): refused over `cap` bytes
// before anything is read.
std::string read_regular(const std::string& path, const std::string& what, uint64_t cap) {
  uint64_t size = 0;
  const int fd = open_regular(path, what, &size);
  if (size > cap) {
    ::close(fd);
    throw Error(what + " '" + path + "' is " + std::to_string(size) + " bytes, over the " + std::to_string(cap) +
                " this reader takes");
  }
  std::string out(size, '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, &out[got], out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // shrank while read: parse what is there
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = open_regular(path, "weights file", &size_);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw Error("cannot map weights file '" + path + "': " + std::strerror(err));
    }
    data_ = static_cast<const unsigned char*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
}

void MappedFile::drop(uint64_t begin, uint64_t end) const {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  begin = (begin + page - 1) / page * page;
  end = end / page * page;
  if (data_ && begin < end) ::madvise(const_cast<unsigned char*>(data_ + begin), end - begin, MADV_DONTNEED);
}

at::Tensor SourceTensor::view() const {
  // The mapping is read-only: nothing writes through this tensor, it is only
  // copied from.
  return at::from_blob(const_cast<unsigned char*>(data), shape, strides, at::TensorOptions().dtype(dtype));
}

at::ScalarType scalar_type_of(const std::string& d) {
  static const std::map<std::string, at::ScalarType> types = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kByte}};
  return types.at(d);  // safetensors_header.cpp refused every other name
}

std::string safetensors_dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return "F64";
    case at::kFloat: return "F32";
    case at::kHalf: return "F16";
    case at::kBFloat16: return "BF16";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kShort: return "I16";
    case at::kChar: return "I8";
    case at::kByte: return "U8";
    case at::kBool: return "BOOL";
    default: throw Error(std::string("safetensors has no dtype for ") + c10::toString(t));
  }
}

std::vector<SourceTensor> open_safetensors(const std::string& path) {
  auto file = std::make_shared<MappedFile>(path);
  const uint64_t n = safetensors_header_length(file->data(), file->size(), path);
  const SafetensorsHeader h =
      parse_safetensors_header(std::string(reinterpret_cast<const char*>(file->data()) + 8, n), file->size(), path);
  std::vector<SourceTensor> out;
  for (const auto& e : h.entries) {
    SourceTensor t;
    t.name = e.name;
    t.dtype = scalar_type_of(e.dtype);
    t.is_bool = e.dtype == "BOOL";
    t.shape = e.shape;
    t.strides.assign(e.shape.size(), 1);
    for (size_t i = e.shape.size(); i-- > 1;) t.strides[i - 1] = t.strides[i] * std::max<int64_t>(e.shape[i], 1);
    t.data = file->data() + e.begin;
    t.begin = e.begin;
    t.end = e.end;
    t.file = file;
    out.push_back(std::move(t));
  }
  return out;
}

namespace {

bool has_suffix(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<SourceTensor> open_file(const std::string& path) {
  if (has_suffix(path, ".safetensors")) return open_safetensors(path);
  return open_torch_zip(path);
}

// A Hugging Face index: {"weight_map": {tensor: file}}, files beside it.
// Only the tensors it names are taken from each file, and each must be there.
std::vector<SourceTensor> open_index(const fs::path& index) {
  const std::string where = "weights index '" + index.string() + "'";
  // 64 MiB: a weight map of a million tensors is a few dozen.
  const std::string text = read_regular(index.string(), "weights index", uint64_t{64} << 20);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + " is not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(where + " has no \"weight_map\" object");
  std::map<std::string, std::set<std::string>> wanted;  // file -> tensors
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) throw Error(where + ": tensor '" + escaped(it.key()) + "' maps to no file name");
    const std::string file = it.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      throw Error(where + ": tensor '" + escaped(it.key()) + "' maps to '" + escaped(file) + "', not a file name beside the index");
    if (!fs::is_regular_file(index.parent_path() / file))
      throw Error(where + ": tensor '" + escaped(it.key()) + "' is in '" + escaped(file) + "', which does not exist");
    wanted[file].insert(it.key());
  }
  std::vector<SourceTensor> out;
  for (const auto& f : wanted) {
    const std::string path = (index.parent_path() / f.first).string();
    std::set<std::string> left = f.second;
    for (auto& t : open_file(path))
      if (left.erase(t.name)) out.push_back(std::move(t));
    if (!left.empty())
      throw Error(where + ": tensor '" + escaped(*left.begin()) + "' is not in '" + path + "', where the index puts it");
  }
  return out;
}

}  // namespace

std::vector<SourceTensor> open_weights(const std::string& path) {
  const fs::path p(path);
  if (!fs::exists(p)) throw Error("weights path '" + path + "' does not exist");
  if (!fs::is_directory(p)) return open_file(path);
  for (const char* index : {"model.safetensors.index.json", "pytorch_model.bin.index.json"})
    if (fs::exists(p / index)) return open_index(p / index);
  for (const char* file : {"model.safetensors", "pytorch_model.bin"})
    if (fs::exists(p / file)) return open_file((p / file).string());
  throw Error("weights directory '" + path +
              "' has none of model.safetensors.index.json, model.safetensors, pytorch_model.bin.index.json, "
              "pytorch_model.bin");
}

}  // namespace shardplan::weights_detail

namespace shardplan {

std::vector<std::pair<std::string, std::vector<int64_t>>> weights_shapes(const std::string& path) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (auto& t : weights_detail::open_weights(path)) out.emplace_back(std::move(t.name), std::move(t.shape));
  return out;
}

}  // namespace shardplan
