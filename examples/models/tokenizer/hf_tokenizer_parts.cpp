// Reading tokenizer.json (hf_tokenizer_parts.h). What the encoder does not
// do is refused by name rather than skipped: an NFKC normalizer, a WordPiece
// model or an lstrip added token would change the ids silently.
#include "models/tokenizer/hf_tokenizer_parts.h"

#include <nlohmann/json.hpp>
#include <re2/re2.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "shardplan/error.h"

namespace shardplan {
namespace examples {
namespace tokenizer_detail {

namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw Error(printable("tokenizer file '" + file + "': " + what));
}

std::string shown(const std::string& s) { return "'" + (s.size() > 80 ? s.substr(0, 80) + "..." : s) + "'"; }

std::string read_bounded(const std::string& path, int64_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail(path, "cannot be read");
  const std::streamoff size = in.tellg();
  if (size < 0) fail(path, "cannot be read");
  if (size > max_bytes)
    fail(path, "is " + std::to_string(size) + " bytes, over the " + std::to_string(max_bytes) + " it may have");
  std::string text(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(&text[0], size)) fail(path, "cannot be read");
  return text;
}

json parse(const std::string& text, const std::string& file) {
  auto bound_depth = [&](int depth, json::parse_event_t, json&) {
    if (depth > kMaxJsonDepth) fail(file, "nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return true;
  };
  try {
    json j = json::parse(text, bound_depth);
    if (!j.is_object()) fail(file, "is not a JSON object");
    return j;
  } catch (const json::exception& e) {
    fail(file, std::string("is not valid JSON (") + e.what() + ")");
  }
}

}  // namespace

json read_json_object(const std::string& path, int64_t max_bytes) { return parse(read_bounded(path, max_bytes), path); }

namespace {

const json* member(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::string as_string(const json& v, const std::string& file, const std::string& what) {
  if (!v.is_string()) fail(file, what + " is not a string");
  return v.get<std::string>();
}

bool as_bool(const json& obj, const char* key, const std::string& file, const std::string& where) {
  const json* v = member(obj, key);
  if (v == nullptr) return false;
  if (!v->is_boolean()) fail(file, where + "." + key + " is not true or false");
  return v->get<bool>();
}

int64_t as_id(const json& v, const std::string& file, const std::string& what) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= kMaxVocab)
    fail(file, what + " is not an id in [0, " + std::to_string(kMaxVocab) + ")");
  return v.get<int64_t>();
}

void check_token(const std::string& token, const std::string& file, const std::string& what) {
  if (token.empty()) fail(file, what + " is empty");
  if (token.size() > kMaxTokenBytes)
    fail(file, what + " is " + std::to_string(token.size()) + " bytes, over " + std::to_string(kMaxTokenBytes));
}

void set_token(HfParts* p, int64_t id, const std::string& token, bool added) {
  if (static_cast<int64_t>(p->id_to_token.size()) <= id) {
    p->id_to_token.resize(id + 1);
    p->is_added.resize(id + 1, 0);
  }
  if (!p->id_to_token[id].empty() && p->id_to_token[id] != token)
    fail(p->file, "id " + std::to_string(id) + " is given to both " + shown(p->id_to_token[id]) + " and " +
                      shown(token));
  p->id_to_token[id] = token;
  p->is_added[id] = added;
  p->vocab[token] = id;
}

// The "<0xNN>" tokens byte fallback spells a character's bytes with.
void read_fallback_ids(HfParts* p) {
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const auto it = p->vocab.find(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
    p->fallback_ids[b] = it == p->vocab.end() ? -1 : it->second;
  }
}

void read_vocab(const json& model, HfParts* p) {
  const json* vocab = member(model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) fail(p->file, "model.vocab is not an object");
  if (static_cast<int64_t>(vocab->size()) > kMaxVocab)
    fail(p->file, "model.vocab has " + std::to_string(vocab->size()) + " tokens, over " + std::to_string(kMaxVocab));
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const std::string what = "model.vocab token " + shown(it.key());
    check_token(it.key(), p->file, what);
    set_token(p, as_id(it.value(), p->file, what), it.key(), false);
  }
  if (!p->byte_level) return read_fallback_ids(p);
  const std::vector<std::string>& chars = byte_to_char();
  for (int b = 0; b < 256; ++b) {
    const auto it = p->vocab.find(chars[b]);
    if (it == p->vocab.end())
      fail(p->file, "model.vocab has no token for byte " + std::to_string(b) + " (" + shown(chars[b]) +
                        "), which a byte-level BPE needs");
    p->byte_ids[b] = it->second;
  }
}

// One merge, "a b" or ["a", "b"].
std::pair<std::string, std::string> merge_pair(const json& m, const std::string& file, const std::string& what) {
  if (m.is_array()) {
    if (m.size() != 2 || !m[0].is_string() || !m[1].is_string()) fail(file, what + " is not two strings");
    return {m[0].get<std::string>(), m[1].get<std::string>()};
  }
  const std::string s = as_string(m, file, what);
  const size_t space = s.find(' ');
  if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
    fail(file, what + " " + shown(s) + " is not two tokens separated by one space");
  return {s.substr(0, space), s.substr(space + 1)};
}

void read_merges(const json& model, HfParts* p) {
  const json* merges = member(model, "merges");
  if (merges == nullptr) return;
  if (!merges->is_array()) fail(p->file, "model.merges is not a list");
  if (static_cast<int64_t>(merges->size()) > kMaxVocab)
    fail(p->file, "model.merges has " + std::to_string(merges->size()) + " merges, over " + std::to_string(kMaxVocab));
  for (size_t i = 0; i < merges->size(); ++i) {
    const std::string what = "model.merges[" + std::to_string(i) + "]";
    const auto ab = merge_pair((*merges)[i], p->file, what);
    int64_t ids[3];
    const std::string parts[3] = {ab.first, ab.second, ab.first + ab.second};
    for (int k = 0; k < 3; ++k) {
      const auto it = p->vocab.find(parts[k]);
      if (it == p->vocab.end()) fail(p->file, what + " names " + shown(parts[k]) + ", which is not in model.vocab");
      ids[k] = it->second;
    }
    if (!p->merges.emplace(pair_key(ids[0], ids[1]), Merge{static_cast<int64_t>(i), ids[2]}).second)
      fail(p->file, what + " repeats an earlier merge of " + shown(ab.first) + " and " + shown(ab.second));
  }
}

void read_model(const json& root, HfParts* p) {
  const json* model = member(root, "model");
  if (model == nullptr || !model->is_object()) fail(p->file, "has no 'model' object");
  const json* type = member(*model, "type");
  if (type == nullptr || as_string(*type, p->file, "model.type") != "BPE")
    fail(p->file, "model.type is not BPE (only byte-level BPE tokenizer.json is supported)");
  for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = member(*model, key);
    if (v != nullptr && !(v->is_string() && v->get<std::string>().empty()))
      fail(p->file, std::string("model.") + key + " is set, which is not supported");
  }
  // Byte-level: checked, every byte has its token anyway.
  p->byte_fallback = as_bool(*model, "byte_fallback", p->file, "model");
  p->fuse_unk = as_bool(*model, "fuse_unk", p->file, "model");
  p->ignore_merges = as_bool(*model, "ignore_merges", p->file, "model");
  read_vocab(*model, p);
  read_merges(*model, p);
  if (const json* unk = member(*model, "unk_token")) {
    const auto it = p->vocab.find(as_string(*unk, p->file, "model.unk_token"));
    if (it == p->vocab.end()) fail(p->file, "model.unk_token " + shown(unk->get<std::string>()) + " is not in model.vocab");
    p->unk = it->second;
  }
}

// Hugging Face's tokenizers does not take an added token's id from the
// file: one the model's vocab has keeps that id, any other gets the next
// past the vocab and past the added ones so far, in file order
// (AddedVocabulary::add_tokens). A file whose ids say otherwise (a gap
// after the vocab) would encode to other ids there than here: refused.
void check_added_id(const HfParts& p, const AddedToken& token, int64_t model_size, int64_t max_added,
                    const std::string& where) {
  const auto in_model = p.vocab.find(token.content);
  int64_t want = max_added >= model_size ? max_added + 1 : model_size;
  if (in_model != p.vocab.end() && !p.is_added[in_model->second]) want = in_model->second;
  if (token.id != want)
    fail(p.file, where + " " + shown(token.content) + " has id " + std::to_string(token.id) +
                     ", but Hugging Face's tokenizers gives it " + std::to_string(want) +
                     " (an added token not in the vocab takes the next id past it)");
}

void read_added_tokens(const json& root, HfParts* p) {
  const json* added = member(root, "added_tokens");
  if (added == nullptr) return;
  if (!added->is_array()) fail(p->file, "added_tokens is not a list");
  if (static_cast<int64_t>(added->size()) > kMaxVocab) fail(p->file, "added_tokens has too many tokens");
  const int64_t model_size = static_cast<int64_t>(p->vocab.size());
  int64_t max_added = -1;
  for (size_t i = 0; i < added->size(); ++i) {
    const json& t = (*added)[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    const json* id = member(t, "id");
    const json* content = member(t, "content");
    if (id == nullptr || content == nullptr) fail(p->file, where + " has no id or no content");
    AddedToken token{as_id(*id, p->file, where + ".id"), as_string(*content, p->file, where + ".content"),
                     as_bool(t, "special", p->file, where)};
    check_token(token.content, p->file, where + ".content");
    for (const char* key : {"single_word", "lstrip", "rstrip"})
      if (as_bool(t, key, p->file, where)) fail(p->file, where + "." + key + " is true, which is not supported");
    check_added_id(*p, token, model_size, max_added, where);
    max_added = std::max(max_added, token.id);
    set_token(p, token.id, token.content, true);
    p->added.push_back(std::move(token));
  }
}

// ByteLevel's own regex (use_regex, GPT-2) and its prefix space.
void read_byte_level(const json& b, HfParts* p, const std::string& where) {
  p->add_prefix_space = as_bool(b, "add_prefix_space", p->file, where);
  if (p->add_prefix_space && !p->splitters.empty())  // it would prefix every piece of the Split before it
    fail(p->file, where + ".add_prefix_space after a Split is not supported");
  const json* use_regex = member(b, "use_regex");
  if (use_regex != nullptr && !use_regex->is_boolean()) fail(p->file, where + ".use_regex is not true or false");
  if (use_regex == nullptr || use_regex->get<bool>())
    p->splitters.push_back(std::make_unique<RegexSplitter>(kGpt2Pattern, p->file));
}

void read_split(const json& s, HfParts* p, const std::string& where) {
  const json* pattern = member(s, "pattern");
  const json* regex = pattern == nullptr ? nullptr : member(*pattern, "Regex");
  const json* literal = pattern == nullptr ? nullptr : member(*pattern, "String");
  if (regex == nullptr && literal == nullptr) fail(p->file, where + ".pattern has no Regex or String");
  const json* behavior = member(s, "behavior");
  if (behavior == nullptr || !behavior->is_string() || behavior->get<std::string>() != "Isolated")
    fail(p->file, where + ".behavior is not Isolated (the only one supported)");
  if (as_bool(s, "invert", p->file, where)) fail(p->file, where + ".invert is true, which is not supported");
  const std::string text = regex != nullptr ? as_string(*regex, p->file, where + ".pattern.Regex")
                                            : RE2::QuoteMeta(as_string(*literal, p->file, where + ".pattern.String"));
  p->splitters.push_back(std::make_unique<RegexSplitter>(text, p->file));
}

struct Step {
  const json* value;
  std::string where, type;
};

// A component (pre_tokenizer, post_processor) or a Sequence of them under
// list_key: each step, where it is and its type.
std::vector<Step> steps_of(const json& c, const std::string& key, const char* list_key, const std::string& file) {
  const json* type = member(c, "type");
  const bool sequence = type != nullptr && type->is_string() && type->get<std::string>() == "Sequence";
  const json* list = sequence ? member(c, list_key) : &c;
  if (list == nullptr || (sequence && (!list->is_array() || list->size() > 16)))
    fail(file, key + "." + list_key + " is not a list of at most 16");
  std::vector<Step> steps;
  for (size_t i = 0; i < (sequence ? list->size() : 1); ++i) {
    const json& step = sequence ? (*list)[i] : *list;
    const json* t = member(step, "type");
    steps.push_back({&step, sequence ? key + "." + list_key + "[" + std::to_string(i) + "]" : key,
                     t != nullptr && t->is_string() ? t->get<std::string>() : ""});
  }
  return steps;
}

Metaspace::Prepend read_prepend_scheme(const json& m, HfParts* p, const std::string& where) {
  if (const json* scheme = member(m, "prepend_scheme")) {
    const std::string v = as_string(*scheme, p->file, where + ".prepend_scheme");
    if (v == "always") return Metaspace::kAlways;
    if (v == "first") return Metaspace::kFirst;
    if (v == "never") return Metaspace::kNever;
    fail(p->file, where + ".prepend_scheme " + shown(v) + " is not always, first or never");
  }
  const json* add = member(m, "add_prefix_space");  // before tokenizers 0.14
  return add == nullptr || as_bool(m, "add_prefix_space", p->file, where) ? Metaspace::kAlways : Metaspace::kNever;
}

std::string read_replacement(const json& m, HfParts* p, const std::string& where) {
  const json* r = member(m, "replacement");
  const std::string v = r == nullptr ? "" : as_string(*r, p->file, where + ".replacement");
  size_t pos = 0;
  if (v.empty() || next_code_point(v, &pos) < 0 || pos != v.size() || v == " ")
    fail(p->file, where + ".replacement is not one character other than a space");
  return v;
}

// Not byte-level: no pre-tokenizer (Llama 2's normalizers do it), or Metaspace.
void read_metaspace(const json* pre, HfParts* p) {
  if (pre == nullptr) return;
  const std::vector<Step> steps = steps_of(*pre, "pre_tokenizer", "pretokenizers", p->file);
  if (steps.empty()) return;
  if (steps.size() != 1 || steps[0].type != "Metaspace")
    fail(p->file, steps[0].where + " is '" + steps[0].type + "' (supported with this decoder: Metaspace or none)");
  const json& m = *steps[0].value;
  p->has_metaspace = true;
  p->metaspace.replacement = read_replacement(m, p, steps[0].where);
  p->metaspace.prepend = read_prepend_scheme(m, p, steps[0].where);
  const json* split = member(m, "split");
  p->metaspace.split = split == nullptr || as_bool(m, "split", p->file, steps[0].where);
}

void read_pre_tokenizer(const json& root, HfParts* p) {
  const json* pre = member(root, "pre_tokenizer");
  if (!p->byte_level) return read_metaspace(pre, p);
  if (pre == nullptr) fail(p->file, "has no pre_tokenizer (byte-level BPE needs ByteLevel)");
  const std::vector<Step> steps = steps_of(*pre, "pre_tokenizer", "pretokenizers", p->file);
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    if (s.type == "Split") {
      read_split(*s.value, p, s.where);
    } else if (s.type == "ByteLevel" && i + 1 == steps.size()) {
      read_byte_level(*s.value, p, s.where);
      return;
    } else {
      fail(p->file, s.where + " is '" + s.type + "' (supported: Split, then ByteLevel last)");
    }
  }
  fail(p->file, "pre_tokenizer has no ByteLevel last (byte-level BPE needs it)");
}

// The special tokens' ids of a TemplateProcessing around sequence A.
void read_template(const json& t, HfParts* p, const std::string& where) {
  const json* single = member(t, "single");
  const json* specials = member(t, "special_tokens");
  if (single == nullptr || !single->is_array() || single->size() > 16)
    fail(p->file, where + ".single is not a list of at most 16");
  bool seen_a = false;
  for (const json& item : *single) {
    if (const json* seq = member(item, "Sequence")) {
      const json* id = member(*seq, "id");
      if (seen_a || id == nullptr || !id->is_string() || id->get<std::string>() != "A")
        fail(p->file, where + ".single has a Sequence other than one A");
      seen_a = true;
      continue;
    }
    const json* special = member(item, "SpecialToken");
    const json* name = special == nullptr ? nullptr : member(*special, "id");
    if (name == nullptr || !name->is_string()) fail(p->file, where + ".single has an item not Sequence or SpecialToken");
    const json* entry = specials == nullptr ? nullptr : member(*specials, name->get<std::string>().c_str());
    const json* ids = entry == nullptr ? nullptr : member(*entry, "ids");
    if (ids == nullptr || !ids->is_array() || ids->size() > 16)
      fail(p->file, where + ".special_tokens has no ids for " + shown(name->get<std::string>()));
    for (const json& id : *ids) {
      const int64_t v = as_id(id, p->file, where + " id of " + shown(name->get<std::string>()));
      if (v >= static_cast<int64_t>(p->id_to_token.size()) || p->id_to_token[v].empty())
        fail(p->file, where + " names id " + std::to_string(v) + ", which is no token's");
      (seen_a ? p->suffix : p->prefix).push_back(v);
    }
  }
  if (!seen_a) fail(p->file, where + ".single has no Sequence A");
}

void read_post_processor(const json& root, HfParts* p) {
  const json* post = member(root, "post_processor");
  if (post == nullptr) return;
  for (const Step& s : steps_of(*post, "post_processor", "processors", p->file)) {
    if (s.type == "TemplateProcessing" && p->prefix.empty() && p->suffix.empty()) read_template(*s.value, p, s.where);
    else if (s.type != "ByteLevel") fail(p->file, s.where + " is '" + s.type + "' (supported: ByteLevel, TemplateProcessing)");
  }
  if (p->prefix.size() == 1) p->bos = p->prefix[0];
  if (p->suffix.size() == 1) p->eos = p->suffix[0];
}

// A Replace's {"pattern": {"String": ...}, "content": ...}.
std::pair<std::string, std::string> read_replace(const json& r, HfParts* p, const std::string& where) {
  const json* pattern = member(r, "pattern");
  const json* literal = pattern == nullptr ? nullptr : member(*pattern, "String");
  const json* content = member(r, "content");
  if (literal == nullptr || content == nullptr) fail(p->file, where + " is not a Replace of a String pattern");
  const std::string from = as_string(*literal, p->file, where + ".pattern.String");
  if (from.empty()) fail(p->file, where + ".pattern.String is empty");
  const std::string to = as_string(*content, p->file, where + ".content");
  // A long replacement of every space would multiply the text's size.
  if (from.size() > kMaxTokenBytes || to.size() > kMaxTokenBytes) fail(p->file, where + " is over 4 KiB");
  return {from, to};
}

void read_normalizer(const json& root, HfParts* p) {
  const json* n = member(root, "normalizer");
  if (n == nullptr) return;
  const std::vector<Step> steps = steps_of(*n, "normalizer", "normalizers", p->file);
  const std::string supported = p->byte_level ? "NFC" : "NFC first, then Prepend and Replace of a String";
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    if (s.type == "NFC" && i == 0) {
      p->nfc = true;
      nfc("", p->file);  // a build without ICU refuses the file now, not at the first encode
    } else if (s.type == "Prepend" && !p->byte_level) {
      const json* text = member(*s.value, "prepend");
      if (text == nullptr) fail(p->file, s.where + " has no prepend");
      p->normalizers.push_back({Normalizer::kPrepend, as_string(*text, p->file, s.where + ".prepend"), ""});
      if (p->normalizers.back().text.size() > kMaxTokenBytes) fail(p->file, s.where + ".prepend is over 4 KiB");
    } else if (s.type == "Replace" && !p->byte_level) {
      const auto r = read_replace(*s.value, p, s.where);
      p->normalizers.push_back({Normalizer::kReplace, r.first, r.second});
    } else {
      fail(p->file, s.where + " is '" + s.type + "', which is not supported (supported: " + supported + ")");
    }
  }
}

// ByteLevel alone (byte-level BPE), or Llama 2's and Mistral's
// Replace/ByteFallback/Fuse/Strip and Metaspace.
void read_decoder(const json& root, HfParts* p) {
  const json* decoder = member(root, "decoder");
  if (decoder == nullptr) fail(p->file, "has no decoder");
  const std::vector<Step> steps = steps_of(*decoder, "decoder", "decoders", p->file);
  if (steps.empty()) fail(p->file, "decoder is an empty Sequence");
  p->byte_level = steps.size() == 1 && steps[0].type == "ByteLevel";
  if (p->byte_level) return;
  for (const Step& s : steps) {
    Decoder d{Decoder::kFuse, "", ""};
    if (s.type == "Replace") {
      const auto r = read_replace(*s.value, p, s.where);
      d = {Decoder::kReplace, r.first, r.second};
    } else if (s.type == "ByteFallback") {
      d.kind = Decoder::kByteFallback;
    } else if (s.type == "Strip") {
      const json* content = member(*s.value, "content");
      const json* start = member(*s.value, "start");
      const json* stop = member(*s.value, "stop");
      if (content == nullptr || start == nullptr || stop == nullptr || !start->is_number_unsigned() ||
          !stop->is_number_unsigned() || start->get<int64_t>() > 64 || stop->get<int64_t>() > 64)
        fail(p->file, s.where + " is not a Strip of content, start and stop (0 to 64)");
      d = {Decoder::kStrip, "", as_string(*content, p->file, s.where + ".content"), start->get<int64_t>(),
           stop->get<int64_t>()};
    } else if (s.type == "Metaspace") {
      d = {Decoder::kMetaspace, read_replacement(*s.value, p, s.where), ""};
      d.prepend = read_prepend_scheme(*s.value, p, s.where);
    } else if (s.type != "Fuse") {
      fail(p->file, s.where + " is '" + s.type +
                        "' (supported: ByteLevel alone, or Replace, ByteFallback, Fuse, Strip, Metaspace)");
    }
    p->decoders.push_back(std::move(d));
  }
}

}  // namespace

HfParts read_hf_parts(const std::string& path) { return read_hf_parts_text(read_bounded(path, kMaxFileBytes), path); }

HfParts read_hf_parts_text(const std::string& text, const std::string& path) {
  HfParts p;
  p.file = path;
  if (static_cast<int64_t>(text.size()) > kMaxFileBytes)
    fail(path, "is over the " + std::to_string(kMaxFileBytes) + " bytes it may have");
  const json root = parse(text, path);
  read_decoder(root, &p);  // first: whether the BPE is byte-level
  read_normalizer(root, &p);
  read_model(root, &p);
  read_added_tokens(root, &p);
  for (const char* key : {"truncation", "padding"})  // each would cut or pad what encode returns
    if (member(root, key) != nullptr) fail(path, std::string(key) + " is set, which is not supported");
  read_pre_tokenizer(root, &p);
  read_post_processor(root, &p);
  return p;
}

}  // namespace tokenizer_detail
}  // namespace examples
}  // namespace shardplan
