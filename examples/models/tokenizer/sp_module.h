#pragma once
// The function table of the module libshardplan_sentencepiece.so
// (sp_module.cpp), which sp_tokenizer.cpp opens with dlopen. Debian's
// libsentencepiece carries its own copy of protobuf-lite under protobuf's
// names; linked into a program with libtorch (which links libprotobuf) the
// two copies' symbols interpose and the program crashes before main. Opened
// RTLD_LOCAL | RTLD_DEEPBIND, the module and SentencePiece bind to their own
// copy and libtorch's never sees it.
#include <string>
#include <vector>

namespace shardplan {
namespace examples {
namespace tokenizer_detail {

struct SentencePieceModule {
  // A processor from a serialized model, or nullptr with *error set.
  void* (*load)(const std::string& bytes, std::string* error);
  void (*destroy)(void* processor);
  bool (*encode)(const void* processor, const std::string& text, std::vector<int>* ids, std::string* error);
  bool (*decode)(const void* processor, const std::vector<int>& ids, std::string* text, std::string* error);
  int (*piece_size)(const void* processor);
  int (*piece_to_id)(const void* processor, const std::string& piece);  // -1 where no piece is it
  int (*bos_id)(const void* processor);
  int (*eos_id)(const void* processor);
};

}  // namespace tokenizer_detail
}  // namespace examples
}  // namespace shardplan

// The one symbol sp_tokenizer.cpp looks up.
extern "C" const shardplan::examples::tokenizer_detail::SentencePieceModule* shardplan_sentencepiece_module();
