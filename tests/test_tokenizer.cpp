// tokenizer.json BPE (examples/models/tokenizer/) against the independent
// reference in tests/tokenizer_reference.py, which trains small GPT-2-,
// Llama-3-, Qwen2- (with and without NFC), Llama-2- and Mistral-style
// tokenizers, writes them as tokenizer.json
// and encodes a varied corpus (Unicode, whitespace runs, digits, emoji,
// CJK, special tokens, the empty string) with them.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "models/tokenizer/tokenizer.h"
#include "shardplan/error.h"

namespace test_tokenizer {

namespace fs = std::filesystem;
using nlohmann::json;
using shardplan::examples::load_hf_tokenizer;
using shardplan::examples::load_tokenizer;

const std::string kPython = "/usr/bin/python3";

class HfTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("shardplan_tokenizer_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const std::string cmd = kPython + " " + SHARDPLAN_SOURCE_DIR + "/tests/tokenizer_reference.py " + dir_.string();
    reference_ok_ = std::system(cmd.c_str()) == 0;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  void SetUp() override { ASSERT_TRUE(reference_ok_) << "tests/tokenizer_reference.py failed"; }

  static json read_json(const fs::path& p) {
    std::ifstream in(p);
    return json::parse(in);
  }
  static std::string text_of(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }

  // The one-line error loading gives, or "" where it loads.
  static std::string load_error(const std::string& path, bool directory = false) {
    try {
      if (directory) load_tokenizer(path);
      else load_hf_tokenizer(path);
    } catch (const shardplan::Error& e) {
      return e.what();
    }
    return "";
  }

  void expect_reference(const std::string& style) {
    const auto tok = load_hf_tokenizer((dir_ / style / "tokenizer.json").string());
    const json corpus = read_json(dir_ / "corpus.json");
    const json expected = read_json(dir_ / style / "expected.json");
    EXPECT_EQ(tok->vocab_size(), expected["vocab_size"].get<int64_t>());
    EXPECT_EQ(tok->bos_id(), expected["bos"].get<int64_t>());
    for (size_t i = 0; i < corpus.size(); ++i) {
      const std::string text = corpus[i].get<std::string>();
      const auto plain = tok->encode(text, false);
      EXPECT_EQ(plain, expected["plain"][i].get<std::vector<int64_t>>()) << style << " encodes '" << text << "'";
      EXPECT_EQ(tok->encode(text, true), expected["special"][i].get<std::vector<int64_t>>()) << style << " '" << text << "'";
      // Byte-level text comes back as it was; NFC and Llama 2's spaces change it.
      EXPECT_EQ(tok->decode(plain), expected["decoded"][i].get<std::string>()) << style << " decodes '" << text << "'";
    }
  }

  static inline fs::path dir_;
  static inline bool reference_ok_ = false;
};

TEST_F(HfTokenizer, Gpt2StyleMatchesReference) { expect_reference("gpt2"); }
TEST_F(HfTokenizer, Llama3StyleMatchesReference) { expect_reference("llama3"); }
TEST_F(HfTokenizer, Qwen2StyleMatchesReference) { expect_reference("qwen2"); }
// Qwen2's real tokenizer.json has an NFC normalizer: decomposed accents and
// jamo compose before the split (unicodedata.normalize in the reference).
TEST_F(HfTokenizer, Qwen2WithNfcMatchesReference) { expect_reference("qwen2_nfc"); }
// SentencePiece-style BPE over characters with byte fallback: Llama 2's
// Prepend/Replace normalizers, Mistral's Metaspace pre-tokenizer
// (prepend_scheme first), and a Metaspace that splits, after NFC; decoded by
// Replace/ByteFallback/Fuse/Strip or Metaspace.
TEST_F(HfTokenizer, Llama2MetaspaceStyleMatchesReference) { expect_reference("llama2"); }
TEST_F(HfTokenizer, MistralMetaspaceStyleMatchesReference) { expect_reference("mistral"); }
TEST_F(HfTokenizer, MetaspaceSplitStyleMatchesReference) { expect_reference("metaspace"); }

// Byte fallback decodes bytes that are not UTF-8 as Hugging Face does: one
// U+FFFD per byte; a run that is UTF-8 is its character.
TEST_F(HfTokenizer, ByteFallbackDecodes) {
  const auto tok = load_hf_tokenizer((dir_ / "llama2" / "tokenizer.json").string());
  const int64_t e6 = tok->token_to_id("<0xE6>"), x97 = tok->token_to_id("<0x97>"), xa5 = tok->token_to_id("<0xA5>");
  ASSERT_GE(e6, 0);
  EXPECT_EQ(tok->decode({e6, x97, xa5}), "\xE6\x97\xA5");  // 日
  EXPECT_EQ(tok->decode({e6, x97}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  const auto ids = tok->encode("\xF0\x9F\xA6\x9C", false);  // a parrot no vocab has: four byte tokens after "▁"
  EXPECT_EQ(tok->decode(ids), "\xF0\x9F\xA6\x9C");
}

TEST_F(HfTokenizer, SpecialTokensAndLookups) {
  const auto tok = load_hf_tokenizer((dir_ / "llama3" / "tokenizer.json").string());
  const int64_t eot = tok->token_to_id("<|eot_id|>");
  ASSERT_GE(eot, 0);
  EXPECT_EQ(tok->token_to_id("no such token"), -1);
  const auto ids = tok->encode("a<|eot_id|>b", false);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], eot);
  EXPECT_EQ(tok->decode(ids), "a<|eot_id|>b");
  EXPECT_EQ(tok->encode("", true), std::vector<int64_t>{tok->bos_id()});
  EXPECT_THROW(tok->decode({tok->vocab_size()}), shardplan::Error);
  EXPECT_THROW(tok->decode({-1}), shardplan::Error);
  EXPECT_THROW(tok->encode(std::string("bad \xff utf-8"), false), shardplan::Error);
}

// One pre-token of a million characters: the heap's merges take O(n log n)
// (rescanning every pair after each merge would look up some 5e11 pairs).
TEST_F(HfTokenizer, LongPreTokensAreQuick) {
  const auto tok = load_hf_tokenizer((dir_ / "gpt2" / "tokenizer.json").string());
  const auto t0 = std::chrono::steady_clock::now();
  for (const std::string& text : {std::string(1 << 20, ' ') + "x", std::string(1 << 20, 'a')}) {
    const auto ids = tok->encode(text, false);
    EXPECT_LE(ids.size(), text[0] == ' ' ? text.size() / 2 + 1 : text.size());  // spaces merge in pairs at least
    EXPECT_EQ(tok->decode(ids), text);
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
}

// Each damaged file: one line naming the file and what is wrong.
TEST_F(HfTokenizer, BadFilesAreOneLine) {
  const std::string good = text_of(dir_ / "llama3" / "tokenizer.json");
  const json j = json::parse(good);
  auto changed = [&](const std::function<void(json&)>& f) {
    json c = j;
    f(c);
    return c.dump();
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"truncated", good.substr(0, good.size() / 2)},
      {"malformed", "{\"model\": [1, 2,, 3]}"},
      {"deep", std::string(200, '[') + std::string(200, ']')},
      {"unknown_merge", changed([](json& c) { c["model"]["merges"][0] = {"Ġ", "NOT_A_TOKEN"}; })},
      {"bad_merge_string", changed([](json& c) { c["model"]["merges"][0] = "abc"; })},
      {"big_id", changed([](json& c) { c["model"]["vocab"]["x"] = 1 << 23; })},
      {"shared_id", changed([](json& c) { c["model"]["vocab"]["not_x"] = c["model"]["vocab"]["x"]; })},
      {"no_byte", changed([](json& c) { c["model"]["vocab"].erase("Ġ"); c["model"]["merges"] = json::array(); })},
      {"wordpiece", changed([](json& c) { c["model"]["type"] = "WordPiece"; })},
      {"normalizer", changed([](json& c) { c["normalizer"] = {{"type", "NFKC"}}; })},
      {"decoder", changed([](json& c) { c["decoder"] = {{"type", "WordPiece"}}; })},
      {"nfc_second", changed([](json& c) {
         c["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "Lowercase"}}, {{"type", "NFC"}}}}};
       })},
      {"lookbehind", changed([](json& c) { c["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(?<=a)b"; })},
      {"lstrip", changed([](json& c) { c["added_tokens"][0]["lstrip"] = true; })},
      {"truncation", changed([](json& c) { c["truncation"] = {{"max_length", 8}}; })},
      {"added_id_gap", changed([](json& c) { c["added_tokens"][0]["id"] = c["added_tokens"][0]["id"].get<int>() + 5; })},
      {"newline_in_pattern",  // found by tokenizer_json_fuzzer: the message quoted it raw
       changed([](json& c) { c["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "a\n[]+"; })},
  };
  const std::vector<std::string> says = {"not valid JSON", "not valid JSON", "nests deeper",
                                         "not in model.vocab", "not two tokens", "not an id",
                                         "is given to both", "no token for byte", "model.type is not BPE",
                                         "normalizer is 'NFKC', which is not supported", "decoder is 'WordPiece'",
                                         "normalizer.normalizers[0] is 'Lowercase'", "lookaround", "lstrip is true",
                                         "truncation is set", "but Hugging Face's tokenizers gives it",
                                         "a\\x0a[]+: RE2 cannot run it"};
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = write(cases[i].first + ".json", cases[i].second);
    const std::string error = load_error(path);
    EXPECT_NE(error.find("tokenizer file '" + path + "'"), std::string::npos) << cases[i].first << ": " << error;
    EXPECT_NE(error.find(says[i]), std::string::npos) << cases[i].first << ": " << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << cases[i].first << ": " << error;
  }
  EXPECT_NE(load_error((dir_ / "missing.json").string()).find("cannot be read"), std::string::npos);
  EXPECT_EQ(load_error((dir_ / "llama3" / "tokenizer.json").string()), "");
}

// A checkpoint directory: tokenizer_config.json and generation_config.json
// decide BOS, EOS and what add_special adds.
TEST_F(HfTokenizer, CheckpointDirectoryConfigs) {
  const fs::path d = dir_ / "checkpoint";
  fs::create_directories(d);
  fs::copy_file(dir_ / "llama3" / "tokenizer.json", d / "tokenizer.json", fs::copy_options::overwrite_existing);
  const auto plain = load_hf_tokenizer((d / "tokenizer.json").string());
  const int64_t bos = plain->token_to_id("<|begin_of_text|>"), end = plain->token_to_id("<|end_of_text|>"),
                eot = plain->token_to_id("<|eot_id|>");
  const std::vector<int64_t> body = plain->encode("Hello world", false);
  {  // the tokenizer file's own choice: its template's BOS, no EOS
    const auto t = load_tokenizer(d.string());
    EXPECT_EQ(t->encode("Hello world", true), plain->encode("Hello world", true));
    EXPECT_EQ(t->bos_id(), bos);
    EXPECT_TRUE(t->eos_ids().empty());
  }
  write("checkpoint/tokenizer_config.json",
        R"({"add_bos_token": true, "add_eos_token": true, "eos_token": {"content": "<|end_of_text|>"},
            "chat_template": "{{ x }}"})");
  {
    const auto t = load_tokenizer(d.string());
    std::vector<int64_t> want{bos};
    want.insert(want.end(), body.begin(), body.end());
    want.push_back(end);
    EXPECT_EQ(t->encode("Hello world", true), want);
    EXPECT_EQ(t->encode("Hello world", false), body);
    EXPECT_EQ(t->eos_ids(), std::vector<int64_t>{end});
  }
  write("checkpoint/generation_config.json", "{\"eos_token_id\": [" + std::to_string(end) + ", " + std::to_string(eot) + "]}");
  EXPECT_EQ(load_tokenizer(d.string())->eos_ids(), (std::vector<int64_t>{end, eot}));
  // Wrong files: one line naming the file and the key.
  const std::string gen = write("checkpoint/generation_config.json", "{\"eos_token_id\": 1000000}");
  std::string error = load_error(d.string(), true);
  EXPECT_NE(error.find("'" + gen + "': eos_token_id is not an id below"), std::string::npos) << error;
  fs::remove(gen);
  const std::string cfg = write("checkpoint/tokenizer_config.json", R"({"eos_token": "<|not a token|>"})");
  EXPECT_NE(load_error(d.string(), true).find("eos_token '<|not a token|>' is no token"), std::string::npos);
  write("checkpoint/tokenizer_config.json", "{\"add_bos_token\": ");
  error = load_error(d.string(), true);
  EXPECT_NE(error.find("'" + cfg + "': is not valid JSON"), std::string::npos) << error;
  fs::remove_all(d);
  fs::create_directories(d);
  EXPECT_NE(load_error(d.string(), true).find("neither tokenizer.json nor tokenizer.model"), std::string::npos);
}

}  // namespace test_tokenizer
