// SentencePiece tokenizer.model (examples/models/tokenizer/sp_tokenizer.cpp)
// against python3-sentencepiece: tests/sentencepiece_reference.py trains a
// BPE model with Llama 2's settings and a unigram model on a generated
// corpus and encodes tokenizer_reference.py's varied corpus with them.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "models/tokenizer/tokenizer.h"
#include "shardplan/error.h"

namespace test_tokenizer_sentencepiece {

namespace fs = std::filesystem;
using nlohmann::json;
using shardplan::examples::load_sentencepiece_tokenizer;
using shardplan::examples::load_tokenizer;

const std::string kPython = "/usr/bin/python3";

bool python_has_sentencepiece() { return std::system((kPython + " -c 'import sentencepiece' 2>/dev/null").c_str()) == 0; }

class SentencePiece : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!python_has_sentencepiece()) return;
    dir_ = fs::temp_directory_path() / ("shardplan_sentencepiece_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const std::string cmd =
        kPython + " " + SHARDPLAN_SOURCE_DIR + "/tests/sentencepiece_reference.py " + dir_.string() + " >/dev/null";
    reference_ok_ = std::system(cmd.c_str()) == 0;
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void SetUp() override {
    if (!python_has_sentencepiece()) GTEST_SKIP() << kPython << " cannot import sentencepiece (python3-sentencepiece)";
    ASSERT_TRUE(reference_ok_) << "tests/sentencepiece_reference.py failed";
    try {
      load_sentencepiece_tokenizer((dir_ / "bpe.model").string());
    } catch (const shardplan::Error& e) {
      if (std::string(e.what()).find("this build has none") != std::string::npos) GTEST_SKIP() << e.what();
    }
  }

  void expect_reference(const std::string& style) {
    const auto tok = load_sentencepiece_tokenizer((dir_ / (style + ".model")).string());
    std::ifstream expected_in(dir_ / "expected.json");
    const json expected = json::parse(expected_in)[style];
    EXPECT_EQ(tok->vocab_size(), expected["vocab_size"].get<int64_t>());
    EXPECT_EQ(tok->bos_id(), expected["bos"].get<int64_t>());
    EXPECT_EQ(tok->eos_id(), expected["eos"].get<int64_t>());
    const auto& ids = expected["ids"];
    const auto& decoded = expected["decoded"];
    ASSERT_GT(ids.size(), 20u);
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string text = decoded[i].get<std::string>();  // every corpus text round-trips in Python
      const auto got = tok->encode(text, false);
      EXPECT_EQ(got, ids[i].get<std::vector<int64_t>>()) << style << " encodes '" << text << "'";
      EXPECT_EQ(tok->decode(got), text) << style;
      auto with_bos = got;
      with_bos.insert(with_bos.begin(), tok->bos_id());
      EXPECT_EQ(tok->encode(text, true), with_bos) << style;
    }
  }

  static inline fs::path dir_;
  static inline bool reference_ok_ = false;
};

TEST_F(SentencePiece, BpeMatchesPython) { expect_reference("bpe"); }
TEST_F(SentencePiece, UnigramMatchesPython) { expect_reference("unigram"); }

TEST_F(SentencePiece, LookupsAndBadIds) {
  const auto tok = load_sentencepiece_tokenizer((dir_ / "bpe.model").string());
  EXPECT_EQ(tok->token_to_id("</s>"), tok->eos_id());
  EXPECT_EQ(tok->token_to_id("no such piece"), -1);
  EXPECT_THROW(tok->decode({tok->vocab_size()}), shardplan::Error);
}

// A file that does not parse: one line naming it.
TEST_F(SentencePiece, BadFileIsOneLine) {
  const fs::path bad = dir_ / "bad.model";
  std::ofstream(bad, std::ios::binary) << "this is not a protobuf \x01\x02\xff";
  std::string error;
  try {
    load_sentencepiece_tokenizer(bad.string());
  } catch (const shardplan::Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("tokenizer file '" + bad.string() + "': is not a SentencePiece model"), std::string::npos)
      << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  std::string truncated;
  {
    std::ifstream in(dir_ / "bpe.model", std::ios::binary);
    truncated.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(dir_ / "truncated.model", std::ios::binary) << truncated.substr(0, truncated.size() / 2);
  EXPECT_THROW(load_sentencepiece_tokenizer((dir_ / "truncated.model").string()), shardplan::Error);
}

// Llama 2's and Mistral's directories: tokenizer.model with
// tokenizer_config.json's add_bos_token / add_eos_token.
TEST_F(SentencePiece, CheckpointDirectory) {
  const fs::path d = dir_ / "checkpoint";
  fs::create_directories(d);
  fs::copy_file(dir_ / "bpe.model", d / "tokenizer.model", fs::copy_options::overwrite_existing);
  const auto plain = load_sentencepiece_tokenizer((d / "tokenizer.model").string());
  std::ofstream(d / "tokenizer_config.json") << R"({"add_bos_token": false, "add_eos_token": true})";
  const auto t = load_tokenizer(d.string());
  auto want = plain->encode("Hello world", false);
  want.push_back(plain->eos_id());
  EXPECT_EQ(t->encode("Hello world", true), want);
  EXPECT_EQ(t->decode(t->encode("Hello world", false)), "Hello world");
}

}  // namespace test_tokenizer_sentencepiece
