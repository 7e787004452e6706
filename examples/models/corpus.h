#pragma once
// A text corpus read as bytes (byte-level language modelling: vocabulary 256,
// no tokenizer, any file works) and random training windows from it.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace at {
class Generator;
}

namespace shardplan {
namespace examples {

class Corpus {
 public:
  static constexpr int64_t kVocab = 256;

  // Throws shardplan::Error when the file cannot be read or is too short.
  explicit Corpus(const std::string& path);

  const std::string& path() const { return path_; }
  int64_t size() const { return bytes_.numel(); }
  // [batch, length] long windows starting at offsets drawn from `gen`
  // (uniform over the corpus; the same generator state, the same windows).
  at::Tensor windows(at::Generator& gen, int64_t batch, int64_t length) const;

 private:
  std::string path_;
  at::Tensor bytes_;  // [n] long
};

// examples/data/sonnets.txt of the source tree the examples were built from.
std::string default_corpus_path();

}  // namespace examples
}  // namespace shardplan
