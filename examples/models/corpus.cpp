#include "models/corpus.h"

#include <ATen/ATen.h>

#include <fstream>
#include <iterator>
#include <vector>

#include "shardplan/error.h"

namespace shardplan {
namespace examples {

Corpus::Corpus(const std::string& path) : path_(path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read corpus '" + path + "'");
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (data.size() < 1024)
    throw Error("corpus '" + path + "' has " + std::to_string(data.size()) + " bytes; need at least 1024");
  bytes_ = at::from_blob(data.data(), {static_cast<int64_t>(data.size())}, at::kByte).to(at::kLong);
}

at::Tensor Corpus::windows(at::Generator& gen, int64_t batch, int64_t length) const {
  if (length >= size()) throw Error("corpus '" + path_ + "' is shorter than a window of " + std::to_string(length));
  at::Tensor start = at::randint(size() - length, {batch, 1}, gen, at::TensorOptions().dtype(at::kLong));
  return at::take(bytes_, start + at::arange(length, at::kLong));
}

std::string default_corpus_path() { return SHARDPLAN_EXAMPLES_DATA_DIR "/sonnets.txt"; }

}  // namespace examples
}  // namespace shardplan
