// SentencePiece behind sp_module.h's function table, built as the module
// libshardplan_sentencepiece.so (why a module: sp_module.h).
#include "models/tokenizer/sp_module.h"

#include <sentencepiece_processor.h>

namespace {

using sentencepiece::SentencePieceProcessor;

const SentencePieceProcessor& sp(const void* p) { return *static_cast<const SentencePieceProcessor*>(p); }

void* load(const std::string& bytes, std::string* error) {
  auto* p = new SentencePieceProcessor();
  const auto status = p->LoadFromSerializedProto(bytes);
  if (status.ok() && p->GetPieceSize() > 0) return p;
  *error = status.ok() ? "it has no pieces" : status.ToString();
  delete p;
  return nullptr;
}

void destroy(void* p) { delete static_cast<SentencePieceProcessor*>(p); }

bool encode(const void* p, const std::string& text, std::vector<int>* ids, std::string* error) {
  const auto status = sp(p).Encode(text, ids);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool decode(const void* p, const std::vector<int>& ids, std::string* text, std::string* error) {
  const auto status = sp(p).Decode(ids, text);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

int piece_size(const void* p) { return sp(p).GetPieceSize(); }
int piece_to_id(const void* p, const std::string& piece) {
  const int id = sp(p).PieceToId(piece);  // the unknown piece's id where none is it
  return id >= 0 && sp(p).IdToPiece(id) == piece ? id : -1;
}
int bos_id(const void* p) { return sp(p).bos_id(); }
int eos_id(const void* p) { return sp(p).eos_id(); }

}  // namespace

extern "C" __attribute__((visibility("default"))) const shardplan::examples::tokenizer_detail::SentencePieceModule*
shardplan_sentencepiece_module() {
  static const shardplan::examples::tokenizer_detail::SentencePieceModule module = {
      load, destroy, encode, decode, piece_size, piece_to_id, bos_id, eos_id};
  return &module;
}
