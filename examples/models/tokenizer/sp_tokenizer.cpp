// SentencePiece tokenizer.model (Llama 2, Mistral, Gemma) through Debian's
// libsentencepiece-dev, behind tokenizer.h. Built only where CMake finds the
// library; elsewhere loading one is an error saying so.
#include <fstream>

#include "models/tokenizer/tokenizer.h"
#include "shardplan/error.h"

#ifdef SHARDPLAN_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace shardplan {
namespace examples {

namespace {

// Far above published models' (Gemma's 256k-piece model is 4 MiB).
constexpr int64_t kMaxModelBytes = int64_t{256} << 20;

[[noreturn]] void fail_model(const std::string& file, const std::string& what) {
  throw Error("tokenizer file '" + file + "': " + what);
}

#ifdef SHARDPLAN_HAVE_SENTENCEPIECE
class SpTokenizer : public Tokenizer {
 public:
  SpTokenizer(const std::string& file, const std::string& bytes) : file_(file) {
    const auto status = sp_.LoadFromSerializedProto(bytes);
    if (!status.ok()) fail_model(file, "is not a SentencePiece model (" + status.ToString() + ")");
    if (sp_.GetPieceSize() <= 0) fail_model(file, "has no pieces");
  }

  std::vector<int64_t> encode(const std::string& text, bool add_special) const override {
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    if (!status.ok()) throw Error("tokenizer '" + file_ + "': cannot encode (" + status.ToString() + ")");
    std::vector<int64_t> out;
    if (add_special && sp_.bos_id() >= 0) out.push_back(sp_.bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<int> narrow;
    for (int64_t id : ids) {
      if (id < 0 || id >= vocab_size())
        throw Error("tokenizer '" + file_ + "': id " + std::to_string(id) + " is no token's");
      narrow.push_back(static_cast<int>(id));
    }
    std::string text;
    const auto status = sp_.Decode(narrow, &text);
    if (!status.ok()) throw Error("tokenizer '" + file_ + "': cannot decode (" + status.ToString() + ")");
    return text;
  }

  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int64_t token_to_id(const std::string& token) const override {
    const int id = sp_.PieceToId(token);  // the unknown piece's id where there is none
    return id >= 0 && sp_.IdToPiece(id) == token ? id : -1;
  }
  int64_t bos_id() const override { return sp_.bos_id(); }
  int64_t eos_id() const override { return sp_.eos_id(); }

 private:
  std::string file_;
  sentencepiece::SentencePieceProcessor sp_;
};
#endif

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail_model(path, "cannot be read");
  const std::streamoff size = in.tellg();
  if (size < 0) fail_model(path, "cannot be read");
  if (size > kMaxModelBytes)
    fail_model(path, "is " + std::to_string(size) + " bytes, over the " + std::to_string(kMaxModelBytes) +
                         " a tokenizer may have");
  std::string bytes(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (size > 0 && !in.read(&bytes[0], size)) fail_model(path, "cannot be read");
#ifdef SHARDPLAN_HAVE_SENTENCEPIECE
  return std::make_unique<SpTokenizer>(path, bytes);
#else
  fail_model(path, "needs SentencePiece, and this build has none (install libsentencepiece-dev and reconfigure)");
#endif
}

}  // namespace examples
}  // namespace shardplan
