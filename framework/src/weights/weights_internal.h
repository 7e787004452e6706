#pragma once
// What the weights folder's files share: memory-mapped files and the tensors
// a weights file holds, described where they lie (weights.h). Not installed.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardplan/weights.h"

namespace shardplan::weights_detail {

// A whole file mapped read-only. Loads read a shard's rows straight from the
// mapping; nothing is read until touched, and drop() returns pages a loaded
// tensor no longer needs, so resident memory stays near the shards.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws naming the file
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Gives back the pages of [begin, end) (rounded inwards to pages).
  void drop(uint64_t begin, uint64_t end) const;

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
};

// One tensor of a weights file, where it lies in its mapping. `view()` is a
// read-only tensor over those bytes (no copy); every byte it can reach was
// checked to be inside the file.
struct SourceTensor {
  std::string name;                      // as in the file
  at::ScalarType dtype;                  // as stored (BOOL is read as uint8)
  std::vector<int64_t> shape, strides;   // strides in elements
  const unsigned char* data = nullptr;   // element [0, 0, ...]
  uint64_t begin = 0, end = 0;           // the bytes it spans in the file
  std::shared_ptr<MappedFile> file;
  bool is_bool = false;                  // stored as BOOL: nonzero bytes are true
  bool transposed = false;               // shape/strides swapped (WeightsOptions::transposed)
  // A part of a fused tensor (WeightsOptions::fused): `name` is then the
  // model's, and this the file's tensor it was cut from.
  std::string fused_from;

  at::Tensor view() const;
};

// Every tensor of `path`: a .safetensors file, a torch.save zip file (.bin,
// .pt, .pth), or a directory holding model.safetensors(.index.json) or
// pytorch_model.bin(.index.json). Parses and checks all headers, indexes and
// offsets; reads no tensor data. Throws shardplan::Error naming the file and
// the tensor.
std::vector<SourceTensor> open_weights(const std::string& path);

// One safetensors file's tensors (safetensors_source.cpp).
std::vector<SourceTensor> open_safetensors(const std::string& path);
// One torch.save zip file's tensors (torch_zip_source.cpp).
std::vector<SourceTensor> open_torch_zip(const std::string& path);

// Names that fully match one of WeightsOptions/SaveWeightsOptions::transposed's
// patterns (transposed.cpp). Throws Error naming the first pattern refused.
class TransposedNames {
 public:
  explicit TransposedNames(const std::vector<std::string>& patterns);
  ~TransposedNames();
  // The pattern `name` fully matches, or nullptr.
  const std::string* match(const std::string& name) const;

 private:
  struct Pattern;
  std::vector<std::unique_ptr<Pattern>> patterns_;
};

// Swaps the shape and strides of every source `patterns` name, so that
// view() is the file tensor's transpose. Throws Error naming `path` and the
// tensor when a matched one is not 2-D.
void transpose_sources(std::vector<SourceTensor>& sources, const std::vector<std::string>& patterns,
                       const std::string& path);
// `sources` with each tensor a WeightsOptions::fused rule matches replaced by
// its parts (fused.cpp): views of its rows, nothing read. Throws Error
// naming `path`'s file and the tensor for a rule it breaks.
std::vector<SourceTensor> split_fused(std::vector<SourceTensor> sources,
                                      const std::vector<WeightsOptions::FusedWeight>& fused);
// The display name of a source in reports: the file's name, and the part.
// A message passes it through escaped() (it may hold a newline).
std::string shown_name(const SourceTensor& s);
// WeightsOptions' pattern lists (rename, fused, transposed) hold a handful
// of patterns in practice; these bounds are far above that and keep each
// list's compiling bounded (each pattern's RE2 program at most 1 MiB).
constexpr size_t kMaxNamePatterns = 1000;
constexpr int64_t kNamePatternMemory = 1 << 20;
// Throws Error "`what` has N `noun` (at most 1000)" for a longer list.
void check_pattern_count(size_t count, const std::string& what, const std::string& noun);
// A name read from a file, fit for a one-line message (safetensors_header.cpp).
std::string escaped(const std::string& name);

// safetensors dtype names <-> torch's.
at::ScalarType scalar_type_of(const std::string& safetensors_dtype);
std::string safetensors_dtype_of(at::ScalarType t);  // throws for types safetensors lacks

}  // namespace shardplan::weights_detail
