// SentencePiece tokenizer.model (Llama 2, Mistral, Gemma) behind
// tokenizer.h, through Debian's libsentencepiece in the module
// libshardplan_sentencepiece.so, opened apart from libtorch (sp_module.h says
// why). A build without libsentencepiece-dev has no module, and loading a
// tokenizer.model is then an error saying so.
#include <dlfcn.h>

#include <fstream>

#include "models/tokenizer/pretokenize.h"
#include "models/tokenizer/sp_module.h"
#include "models/tokenizer/tokenizer.h"
#include "shardplan/error.h"

namespace shardplan {
namespace examples {

namespace {

using tokenizer_detail::SentencePieceModule;

// Far above published models' (Gemma's 256k-piece model is 4 MiB).
constexpr int64_t kMaxModelBytes = int64_t{256} << 20;

[[noreturn]] void fail_model(const std::string& file, const std::string& what) {
  throw Error(tokenizer_detail::printable("tokenizer file '" + file + "': " + what));
}

// Opened once and kept: SentencePiece's protobuf registrations cannot be
// undone safely.
#if defined(__SANITIZE_ADDRESS__)
#define SHARDPLAN_NO_DEEPBIND 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SHARDPLAN_NO_DEEPBIND 1
#endif
#endif

const SentencePieceModule* module_for(const std::string& file) {
#if defined(SHARDPLAN_NO_DEEPBIND)
  // AddressSanitizer refuses RTLD_DEEPBIND, and without it the module would
  // bind to libtorch's protobuf.
  fail_model(file, "needs SentencePiece, and this build has none (sanitized builds cannot open its module)");
#elif defined(SHARDPLAN_SENTENCEPIECE_MODULE)
  static void* handle = dlopen(SHARDPLAN_SENTENCEPIECE_MODULE, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (handle == nullptr)
    fail_model(file, std::string("needs SentencePiece, and its module did not open (") + dlerror() + ")");
  using Entry = const SentencePieceModule* (*)();
  const auto entry = reinterpret_cast<Entry>(dlsym(handle, "shardplan_sentencepiece_module"));
  if (entry == nullptr)
    fail_model(file, std::string("needs SentencePiece, and its module has no entry (") + SHARDPLAN_SENTENCEPIECE_MODULE + ")");
  return entry();
#else
  fail_model(file, "needs SentencePiece, and this build has none (install libsentencepiece-dev and reconfigure)");
#endif
}

class SpTokenizer : public Tokenizer {
 public:
  SpTokenizer(const std::string& file, const std::string& bytes) : file_(file), m_(module_for(file)) {
    std::string error;
    sp_ = m_->load(bytes, &error);
    if (sp_ == nullptr) fail_model(file, "is not a SentencePiece model (" + error + ")");
  }
  ~SpTokenizer() override { m_->destroy(sp_); }
  SpTokenizer(const SpTokenizer&) = delete;
  SpTokenizer& operator=(const SpTokenizer&) = delete;

  std::vector<int64_t> encode(const std::string& text, bool add_special) const override {
    std::vector<int> ids;
    std::string error;
    if (!m_->encode(sp_, text, &ids, &error)) throw Error("tokenizer '" + file_ + "': cannot encode (" + error + ")");
    std::vector<int64_t> out;
    if (add_special && bos_id() >= 0) out.push_back(bos_id());
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
    std::string text, error;
    if (!m_->decode(sp_, narrow, &text, &error)) throw Error("tokenizer '" + file_ + "': cannot decode (" + error + ")");
    return text;
  }

  int64_t vocab_size() const override { return m_->piece_size(sp_); }
  int64_t token_to_id(const std::string& token) const override { return m_->piece_to_id(sp_, token); }
  int64_t bos_id() const override { return m_->bos_id(sp_); }
  int64_t eos_id() const override { return m_->eos_id(sp_); }

 private:
  std::string file_;
  const SentencePieceModule* m_;
  void* sp_ = nullptr;
};

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
  return std::make_unique<SpTokenizer>(path, bytes);
}

}  // namespace examples
}  // namespace shardplan
