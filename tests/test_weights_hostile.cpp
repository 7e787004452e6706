// Hostile weights files (issue 33): sizes a file claims beyond itself, nesting
// that would recurse, named pipes where a file should be, config.json sizes
// no weights or machine can hold, and names libtorch refuses. Each is refused
// with one line naming the file (and the key, tensor or parameter), promptly;
// none crashes or hangs. The files are built byte by byte here.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>

#include "models/hf_config.h"
#include "models/hf_config_fit.h"
#include "shardplan/error.h"
#include "shardplan/nn/deferred_init.h"
#include "shardplan/nn/embedding.h"
#include "shardplan/weights.h"
#include "weights_util.h"

namespace test_weights_hostile {

namespace {

using namespace weights_test;

std::string le(uint64_t v, int n) {
  std::string s(static_cast<size_t>(n), '\0');
  for (int i = 0; i < n; ++i) s[static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
  return s;
}

// A zip record: stored (method 0) or "deflated" (8) with whatever
// uncompressed size it claims; its bytes are never inflated.
struct Record {
  std::string name, bytes;
  uint16_t method = 0;
  uint32_t claimed = 0;  // uncompressed size; 0: the bytes' own
};

std::string zip(const std::vector<Record>& records) {
  std::string out, dir;
  for (const auto& r : records) {
    const uint64_t local = out.size(), size = r.bytes.size(), plain = r.claimed ? r.claimed : size;
    const std::string sizes = le(0, 4) + le(size, 4) + le(plain, 4) + le(r.name.size(), 2);  // crc, sizes, name
    out += le(0x04034b50, 4) + le(20, 2) + le(0, 2) + le(r.method, 2) + le(0, 4) + sizes + le(0, 2) + r.name + r.bytes;
    dir += le(0x02014b50, 4) + le(20, 2) + le(20, 2) + le(0, 2) + le(r.method, 2) + le(0, 4) + sizes +
           le(0, 2) + le(0, 2) + le(0, 2) + le(0, 2) + le(0, 4) + le(local, 4) + r.name;
  }
  const uint64_t n = records.size();
  return out + dir + le(0x06054b50, 4) + le(0, 4) + le(n, 2) + le(n, 2) + le(dir.size(), 4) + le(out.size(), 4) +
         le(0, 2);
}

// A literal's every byte, NULs included.
template <size_t N>
std::string bytes(const char (&s)[N]) {
  return std::string(s, N - 1);
}

// An empty state dict, as protocol 2 pickles collections.OrderedDict().
const std::string kEmptyStateDict = bytes("\x80\x02" "ccollections\nOrderedDict\nq\x00)Rq\x01.");

class WeightsHostile : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = temp_dir("hostile"); }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p.string();
  }
  std::string fifo(const std::string& name) {
    const fs::path p = dir_ / name;
    EXPECT_EQ(::mkfifo(p.c_str(), 0600), 0);
    return p.string();
  }

  fs::path dir_;
};

// fn's error, which must be one line containing every one of `want`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& want) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& w : want) EXPECT_NE(msg.find(w), std::string::npos) << "no '" << w << "' in: " << msg;
  }
}

// fn on a thread, given 10 s: a blocking open of the pipe `fifo` would
// otherwise wait for ever. If it does, the pipe's other end is opened (and
// closed) to let it go, and the test fails.
void expect_error_promptly(const std::string& fifo, const std::function<void()>& fn,
                           const std::vector<std::string>& want) {
  auto done = std::async(std::launch::async, [&] { expect_error(fn, want); });
  if (done.wait_for(std::chrono::seconds(10)) == std::future_status::timeout) {
    ADD_FAILURE() << "blocked on the named pipe " << fifo;
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  done.get();
}

TEST_F(WeightsHostile, DeflatedRecordClaimingGigabytes) {
  // Was an out-of-bounds read of 3 GB from a file of a few hundred bytes.
  const std::string path = write("big.bin", zip({{"archive/data.pkl", kEmptyStateDict},
                                                 {"archive/byteorder", "\x01\x02\x03\x04\x05", 8, 3000000000u}}));
  expect_error([&] { shardplan::read_weights(path); },
               {path, "archive/byteorder", "claims 3000000000 bytes uncompressed from 5 compressed"});
}

TEST_F(WeightsHostile, DeflatedByteorderIsNotBigEndian) {
  // Was "written on a big-endian machine".
  const std::string path = write("deflated.bin", zip({{"archive/data.pkl", kEmptyStateDict},
                                                      {"archive/byteorder", "\x01\x02\x03\x04\x05", 8, 6}}));
  expect_error([&] { shardplan::read_weights(path); }, {path, "'byteorder' is compressed (deflated)"});
  const std::string big = write("big_endian.bin", zip({{"archive/data.pkl", kEmptyStateDict}, {"archive/byteorder", "big"}}));
  expect_error([&] { shardplan::read_weights(big); }, {big, "big-endian"});
  const std::string good = write("good.bin", zip({{"archive/data.pkl", kEmptyStateDict}, {"archive/byteorder", "little"}}));
  EXPECT_TRUE(shardplan::read_weights(good).empty());
}

TEST_F(WeightsHostile, DeeplyNestedPickle) {
  // 400,000 nested 1-tuples: was a stack overflow destroying them.
  const std::string pkl = std::string("\x80\x02N", 3) + std::string(400000, '\x85') + ".";
  const std::string path = write("nested.bin", zip({{"archive/data.pkl", pkl}, {"archive/byteorder", "little"}}));
  expect_error([&] { shardplan::read_weights(path); }, {path, "nests values more than 64 levels deep"});
  // A list appended to itself through the memo: no recursion, no leak.
  const std::string cycle = bytes("\x80\x02]q\x00" "h\x00" "a" "h\x00" "a.");
  const std::string looped = write("cycle.bin", zip({{"archive/data.pkl", cycle}, {"archive/byteorder", "little"}}));
  expect_error([&] { shardplan::read_weights(looped); }, {looped, "not a state dict"});
}

TEST_F(WeightsHostile, NamedPipesAreRefusedNotOpened) {
  const std::string st = fifo("model.safetensors");
  expect_error_promptly(st, [&] { shardplan::read_weights(dir_.string()); }, {st, "not a regular file"});
  expect_error_promptly(st, [&] { shardplan::read_weights(st); }, {st, "not a regular file"});
  const std::string index = fifo("model.safetensors.index.json");
  expect_error_promptly(index, [&] { shardplan::read_weights(dir_.string()); }, {index, "not a regular file"});
  const std::string bin = fifo("pytorch_model.bin");
  expect_error_promptly(bin, [&] { shardplan::read_weights(bin); }, {bin, "not a regular file"});
  const std::string config = fifo("config.json");
  EXPECT_EQ(shardplan::examples::find_hf_config(dir_.string()), config);  // found, not skipped
  expect_error_promptly(config, [&] { shardplan::examples::read_hf_config(config, "llama"); },
                        {config, "not a regular file"});
}

// A two-layer Llama's weights (hidden 8, vocab 16, mlp 12), zeros, and its
// config.json with `change` applied.
class LlamaConfigFits : public WeightsHostile {
 protected:
  std::string weights_and_config(const std::string& key, const std::string& value) {
    shardplan::StateDict sd = {{"model.embed_tokens.weight", torch::zeros({16, 8})}, {"model.norm.weight", torch::zeros({8})},
                               {"lm_head.weight", torch::zeros({16, 8})}};
    for (int i = 0; i < 2; ++i) {
      const std::string l = "model.layers." + std::to_string(i) + ".";
      for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"}) sd.emplace_back(l + "self_attn." + p + ".weight", torch::zeros({8, 8}));
      for (const char* p : {"gate_proj", "up_proj"}) sd.emplace_back(l + "mlp." + p + ".weight", torch::zeros({12, 8}));
      sd.emplace_back(l + "mlp.down_proj.weight", torch::zeros({8, 12}));
      sd.emplace_back(l + "input_layernorm.weight", torch::zeros({8}));
      sd.emplace_back(l + "post_attention_layernorm.weight", torch::zeros({8}));
    }
    shardplan::write_safetensors((dir_ / "model.safetensors").string(), sd);
    std::map<std::string, std::string> c = {{"vocab_size", "16"}, {"hidden_size", "8"}, {"num_attention_heads", "2"},
                                            {"num_key_value_heads", "2"}, {"num_hidden_layers", "2"},
                                            {"intermediate_size", "12"}, {"max_position_embeddings", "16"}};
    c[key] = value;
    std::string json = "{";
    for (const auto& kv : c) json += (json.size() > 1 ? ", \"" : "\"") + kv.first + "\": " + kv.second;
    return write("config.json", json + "}");
  }
  void check(const std::string& config, bool strict, const shardplan::examples::Overrides& cli = {}) {
    auto overrides = shardplan::examples::read_hf_config(config, "llama");
    for (const auto& kv : cli) overrides[kv.first] = kv.second;
    shardplan::examples::check_hf_config_fits(config, overrides, cli, dir_.string(), strict, 4);
  }
};

TEST_F(LlamaConfigFits, TheWeightsOwnConfigFits) { check(weights_and_config("num_hidden_layers", "2"), true); }

TEST_F(LlamaConfigFits, LayersTheWeightsDoNotHold) {
  // 2^31 layers: was minutes of building layers before any name was compared.
  const std::string config = weights_and_config("num_hidden_layers", "2147483648");
  const auto start = std::chrono::steady_clock::now();
  expect_error([&] { check(config, true); }, {"num_hidden_layers 2147483648", config, "2 layers (indices 0 to 1)"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  expect_error([&] { check(config, false); }, {"num_hidden_layers 2147483648", "memory available"});
  expect_error([&] { check(weights_and_config("num_hidden_layers", "3"), true); }, {"num_hidden_layers 3"});
  expect_error([&] { check(weights_and_config("num_hidden_layers", "2"), true, {{"layers", "5"}}); },
               {"layers=5 (--config)"});
}

TEST_F(LlamaConfigFits, VocabNoTensorCanHold) {
  // 2^40: was DeferredInit's "cannot reserve ... for a parameter", naming neither.
  const std::string config = weights_and_config("vocab_size", "1099511627776");
  expect_error([&] { check(config, true); },
               {"vocab_size 1099511627776", config, "model.embed_tokens.weight", "largest tensor in the weights"});
  expect_error([&] { check(config, false); }, {"vocab_size 1099511627776", "model.embed_tokens.weight", "memory"});
  expect_error([&] { check(weights_and_config("vocab_size", "18446744073709551615"), true); },
               {"vocab_size is 18446744073709551615, not between 0 and"});
}

// A vocab_size the tensors could hold but is not their rows (a padded or
// cut config.json): named here, not as a shape mismatch in the load.
TEST_F(LlamaConfigFits, VocabOtherThanTheEmbeddingRows) {
  const std::string config = weights_and_config("vocab_size", "12");
  expect_error([&] { check(config, true); },
               {"vocab_size 12 does not match the weights", config, "model.embed_tokens.weight has 16 rows"});
  expect_error([&] { check(weights_and_config("vocab_size", "16"), true, {{"vocab", "12"}}); },
               {"vocab=12 (--config) does not match"});
}

TEST(HfConfigText, HugeValuesAreRefusedNotOverflowed) {
  // head_dim x heads overflowed int64 (UBSan) before the check divided.
  expect_error([] {
    shardplan::examples::read_hf_config_text(R"({"head_dim": 9223372036854775807, "hidden_size": 1, "num_attention_heads": 2})",
                                             "c.json", "llama");
  }, {"c.json", "head_dim 9223372036854775807"});
  // A float size reached get<long long> (UBSan, hf_config_fuzzer): now the key check names it.
  expect_error([] {
    shardplan::examples::read_hf_config_text(
        R"({"head_dim": 92233720364775807, "hidden_size": 44444444444444444444444444444444444444444441, "num_attention_heads": 2})",
        "c.json", "llama");
  }, {"c.json", "hidden_size is 4.4"});
  const std::string deep = "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  expect_error([&] { shardplan::examples::read_hf_config_text(deep, "c.json", "llama"); },
               {"c.json", "nests values more than 32 levels deep"});
}

TEST(DeferredInitMessage, NamesTheParameter) {
  shardplan::nn::DeferredInit deferred(at::kFloat);
  expect_error([] { shardplan::nn::Embedding(int64_t{1} << 40, int64_t{1} << 20); },
               {"'Embedding.weight'", "[1099511627776, 1048576]", "Float"});
  expect_error([] { shardplan::nn::Embedding(int64_t{1} << 62, int64_t{1} << 20); }, {"over 2^64", "'Embedding.weight'"});
}

// `shardplan ckpt convert --from safetensors SRC`: exit 1 and one line on stderr.
std::string convert_error(const std::string& src, const fs::path& out, const std::string& more = "") {
  const std::string tool = std::string(SHARDPLAN_BINARY_DIR) + "/bin/shardplan-ckpt";
  const std::string cmd = "timeout 60 " + tool + " convert --from safetensors '" + src + "' --out '" + out.string() +
                          "' " + more + " 2>&1 >/dev/null; echo \"exit $?\"";
  std::string text;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    std::array<char, 4096> buf{};
    while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) text.append(buf.data(), n);
    ::pclose(p);
  }
  return text;
}

TEST_F(WeightsHostile, CkptConvertRefusesEachInOneLine) {
  const std::string header = R"({"encoder.":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  const std::string empty_part = write("encoder.safetensors", le(header.size(), 8) + header + std::string(4, '\0'));
  const std::string nested =
      write("nested.bin", zip({{"archive/data.pkl", std::string("\x80\x02N", 3) + std::string(400000, '\x85') + "."}}));
  const std::string big = write("big.bin", zip({{"archive/data.pkl", kEmptyStateDict},
                                                {"archive/byteorder", "\x01\x02\x03\x04\x05", 8, 3000000000u}}));
  const std::string pipe = fifo("pipe.safetensors"), plan = fifo("plan.yaml");
  const std::string good_header = R"({"encoder.w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  const std::string good = write("good.safetensors", le(good_header.size(), 8) + good_header + std::string(4, '\0'));
  const std::vector<std::array<std::string, 3>> cases = {  // source, message, options
      {empty_part, "tensor 'encoder.' in '" + empty_part + "'", ""},
      {nested, "nests values more than 64 levels deep", ""},
      {big, "claims 3000000000 bytes uncompressed", ""},
      {pipe, "not a regular file", ""},
      {good, "'" + plan + "' is not a regular file", "--plan " + plan}};
  for (const auto& c : cases) {
    const std::string got = convert_error(c[0], dir_ / "out", c[2]);
    const std::string want = "shardplan ckpt convert: ";
    EXPECT_EQ(got.rfind(want, 0), 0u) << got;
    EXPECT_NE(got.find(c[1]), std::string::npos) << got;
    if (c[2].empty()) EXPECT_NE(got.find(c[0]), std::string::npos) << got;
    EXPECT_EQ(got.substr(got.find('\n') + 1), "exit 1\n") << "not one line, or not exit 1: " << got;
  }
}

}  // namespace

}  // namespace test_weights_hostile
