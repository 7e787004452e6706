// Hugging Face tokenizer.json BPE, byte-level or with byte fallback (tokenizer.h). The file is
// read whole (bounded), parsed by nlohmann's iterative parser with a depth
// bound, and every count, id and token length is checked before use.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <queue>
#include <unordered_map>

#include "models/tokenizer/hf_tokenizer_parts.h"
#include "models/tokenizer/tokenizer.h"
#include "shardplan/error.h"

namespace shardplan {
namespace examples {

namespace {

using nlohmann::json;
using namespace tokenizer_detail;

class HfTokenizer : public Tokenizer {
 public:
  explicit HfTokenizer(HfParts parts) : p_(std::move(parts)) {
    for (size_t i = 0; i < p_.added.size(); ++i)
      if (!p_.added[i].content.empty())
        added_by_first_byte_[static_cast<unsigned char>(p_.added[i].content[0])].push_back(i);
    for (auto& list : added_by_first_byte_)  // the longest first: leftmost-longest matching
      std::stable_sort(list.begin(), list.end(),
                       [&](size_t a, size_t b) { return p_.added[a].content.size() > p_.added[b].content.size(); });
  }

  std::vector<int64_t> encode(const std::string& text, bool add_special) const override {
    if (!valid_utf8(text)) throw Error("tokenizer '" + p_.file + "': the text to encode is not UTF-8");
    std::vector<int64_t> ids;
    if (add_special) ids = p_.prefix;
    size_t segment = 0;
    for (size_t pos = 0; pos < text.size();) {
      const AddedToken* token = added_at(text, pos);
      if (token == nullptr) {
        ++pos;
        continue;
      }
      encode_segment(text.substr(segment, pos - segment), segment == 0, &ids);
      ids.push_back(token->id);
      pos += token->content.size();
      segment = pos;
    }
    encode_segment(text.substr(segment), segment == 0, &ids);
    if (add_special) ids.insert(ids.end(), p_.suffix.begin(), p_.suffix.end());
    return ids;
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::string out;
    std::vector<std::string> tokens;
    for (int64_t id : ids) {
      if (id < 0 || id >= vocab_size() || p_.id_to_token[id].empty())
        throw Error("tokenizer '" + p_.file + "': id " + std::to_string(id) + " is no token's");
      const std::string& token = p_.id_to_token[id];
      if (!p_.byte_level) {
        tokens.push_back(token);
        continue;
      }
      if (p_.is_added[id]) {
        out += token;
        continue;
      }
      for (size_t pos = 0; pos < token.size();) {
        const size_t start = pos;
        const int byte = byte_of_char(next_code_point(token, &pos));
        if (byte >= 0) out += static_cast<char>(byte);
        else out += token.substr(start, pos - start);  // not a byte's character: as written
      }
    }
    return p_.byte_level ? out : run_decoders(p_, std::move(tokens));
  }

  int64_t vocab_size() const override { return static_cast<int64_t>(p_.id_to_token.size()); }
  int64_t token_to_id(const std::string& token) const override {
    const auto it = p_.vocab.find(token);
    return it == p_.vocab.end() ? -1 : it->second;
  }
  int64_t bos_id() const override { return p_.bos; }
  int64_t eos_id() const override { return p_.eos; }

 private:
  const AddedToken* added_at(const std::string& text, size_t pos) const {
    for (size_t i : added_by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const std::string& c = p_.added[i].content;
      if (text.compare(pos, c.size(), c) == 0) return &p_.added[i];
    }
    return nullptr;
  }

  // `at_start`: the segment begins the text (no added token before it).
  void encode_segment(std::string segment, bool at_start, std::vector<int64_t>* ids) const {
    if (segment.empty()) return;
    if (p_.nfc) segment = nfc(segment, p_.file);
    if (!p_.byte_level) {
      for (const std::string& w : metaspace_words(p_, std::move(segment), at_start)) encode_chars(w, ids);
      return;
    }
    if (p_.add_prefix_space && segment[0] != ' ') segment.insert(0, " ");
    std::vector<std::string> words{std::move(segment)};
    for (const auto& splitter : p_.splitters) {
      std::vector<std::string> next;
      for (const std::string& w : words)
        for (std::string& piece : splitter->split(w)) next.push_back(std::move(piece));
      words.swap(next);
    }
    for (const std::string& w : words) encode_word(w, ids);
  }

  // BPE on one pre-token: the lowest-ranked adjacent pair merges first, the
  // leftmost of equal ranks (Hugging Face's and GPT-2's order).
  void encode_word(const std::string& word, std::vector<int64_t>* ids) const {
    std::string mapped;
    std::vector<int64_t> symbols;
    for (unsigned char b : word) {
      mapped += byte_to_char()[b];
      symbols.push_back(p_.byte_ids[b]);
    }
    if (p_.ignore_merges) {
      const auto it = p_.vocab.find(mapped);
      if (it != p_.vocab.end()) {
        ids->push_back(it->second);
        return;
      }
    }
    merge_all(symbols, ids);
  }

  // Not byte-level: a symbol per character, the vocab's, else its bytes'
  // "<0xNN>" tokens, else unk (as Hugging Face's BPE::merge_word).
  void encode_chars(const std::string& word, std::vector<int64_t>* ids) const {
    if (p_.ignore_merges) {
      const auto it = p_.vocab.find(word);
      if (it != p_.vocab.end()) return ids->push_back(it->second);
    }
    std::vector<int64_t> symbols;
    bool last_unk = false;
    for (size_t pos = 0; pos < word.size();) {
      const size_t start = pos;
      next_code_point(word, &pos);
      const std::string ch = word.substr(start, pos - start);
      const auto it = p_.vocab.find(ch);
      if (it != p_.vocab.end()) {
        symbols.push_back(it->second);
        last_unk = false;
        continue;
      }
      const bool bytes = p_.byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char c) {
                           return p_.fallback_ids[static_cast<unsigned char>(c)] >= 0;
                         });
      if (bytes) {
        for (unsigned char c : ch) symbols.push_back(p_.fallback_ids[c]);
        last_unk = false;
      } else if (p_.unk >= 0) {
        if (!(p_.fuse_unk && last_unk)) symbols.push_back(p_.unk);
        last_unk = true;
      }
    }
    merge_all(symbols, ids);
  }

  // Merges by a heap of (rank, position), as Hugging Face's Word::merge_all:
  // O(n log n), where rescanning every pair after each merge is O(n^2) and
  // a prompt of a million spaces (one pre-token) would not end.
  void merge_all(const std::vector<int64_t>& start, std::vector<int64_t>* ids) const {
    const int64_t n = static_cast<int64_t>(start.size());
    std::vector<int64_t> id = start, next(n), prev(n);
    for (int64_t i = 0; i < n; ++i) {
      next[i] = i + 1 < n ? i + 1 : -1;
      prev[i] = i - 1;
    }
    using Entry = std::pair<int64_t, int64_t>;  // (rank, position of the pair's left symbol)
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    const auto push = [&](int64_t left) {
      if (left < 0 || next[left] < 0) return;
      const auto it = p_.merges.find(pair_key(id[left], id[next[left]]));
      if (it != p_.merges.end()) heap.emplace(it->second.rank, left);
    };
    for (int64_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      const auto [rank, left] = heap.top();
      heap.pop();
      const int64_t right = id[left] < 0 ? -1 : next[left];
      if (right < 0) continue;  // merged away, or no right neighbour any more
      const auto it = p_.merges.find(pair_key(id[left], id[right]));
      if (it == p_.merges.end() || it->second.rank != rank) continue;  // the pair changed since
      id[left] = it->second.id;
      id[right] = -1;
      next[left] = next[right];
      if (next[left] >= 0) prev[next[left]] = left;
      push(prev[left]);
      push(left);
    }
    for (int64_t i = n > 0 ? 0 : -1; i >= 0; i = next[i]) ids->push_back(id[i]);
  }

  HfParts p_;
  std::vector<size_t> added_by_first_byte_[256];
};

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  return std::make_unique<HfTokenizer>(read_hf_parts(path));
}

std::unique_ptr<Tokenizer> load_hf_tokenizer_text(const std::string& text, const std::string& name) {
  return std::make_unique<HfTokenizer>(read_hf_parts_text(text, name));
}

}  // namespace examples
}  // namespace shardplan
