// Bad weights files (docs/WEIGHTS.md): each is refused with one line naming
// the file and, where there is one, the tensor; the model is left as it was.
// The files are written byte by byte here, not with the library's writer.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <fstream>

#include "shardplan/error.h"
#include "shardplan/weights.h"
#include "weights_util.h"

namespace test_weights_bad_input {

namespace {

using namespace weights_test;

// A model with parameters "fc.weight" [2, 3] and "fc.bias" [2].
struct Net : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  Net() { fc = register_module("fc", torch::nn::Linear(3, 2)); }
};

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

// A safetensors file: 8-byte length, `header`, then `data`.
std::string safetensors(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

std::string floats(int n) {
  std::string s(static_cast<size_t>(n) * 4, '\0');
  for (int i = 0; i < n; ++i) {
    const float f = 0.5f * static_cast<float>(i + 1);
    std::memcpy(&s[static_cast<size_t>(i) * 4], &f, 4);
  }
  return s;
}

const std::string kGood =
    R"({"fc.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
    R"("fc.bias":{"dtype":"F32","shape":[2],"data_offsets":[24,32]}})";

class WeightsBadInput : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = temp_dir("bad"); }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p.string();
  }

  // Loading `path` throws one line containing every one of `want`, and the
  // model keeps its values.
  void expect_refused(const std::string& path, const std::vector<std::string>& want) {
    Net net;
    const auto before = cloned(shardplan::local_state_dict(net));
    try {
      shardplan::load_weights(net, {}, path);
      ADD_FAILURE() << path << " was loaded";
    } catch (const shardplan::Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_NE(msg.find(path), std::string::npos) << "the message does not name the file: " << msg;
      for (const auto& w : want) EXPECT_NE(msg.find(w), std::string::npos) << "no '" << w << "' in: " << msg;
    }
    expect_same(shardplan::local_state_dict(net), before, "after refusing " + path);
  }

  fs::path dir_;
};

TEST_F(WeightsBadInput, GoodFileLoads) {  // the baseline the others break
  Net net;
  shardplan::load_weights(net, {}, write("good.safetensors", safetensors(kGood, floats(8))));
  EXPECT_FLOAT_EQ(net.fc->weight[1][2].item<float>(), 3.0f);
  EXPECT_FLOAT_EQ(net.fc->bias[1].item<float>(), 4.0f);
}

TEST_F(WeightsBadInput, TruncatedFile) {
  const std::string whole = safetensors(kGood, floats(8));
  expect_refused(write("cut.safetensors", whole.substr(0, whole.size() - 6)), {"'fc.bias'", "outside the data"});
  expect_refused(write("tiny.safetensors", "abc"), {"truncated"});
}

TEST_F(WeightsBadInput, HeaderLengthPastTheEnd) {
  expect_refused(write("len.safetensors", le64(4096) + kGood + floats(8)), {"runs past the end"});
}

TEST_F(WeightsBadInput, HeaderOverTheCap) {
  // 200 MB claimed, and nothing is allocated for it: refused from the 8 bytes.
  expect_refused(write("cap.safetensors", le64(200'000'000) + kGood), {"over the cap"});
}

TEST_F(WeightsBadInput, OverlappingOffsets) {
  const std::string h = R"({"fc.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                        R"("fc.bias":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})";
  expect_refused(write("overlap.safetensors", safetensors(h, floats(8))), {"'fc.weight'", "'fc.bias'", "overlap"});
}

TEST_F(WeightsBadInput, OffsetsOutOfRange) {
  const std::string h = R"({"fc.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                        R"("fc.bias":{"dtype":"F32","shape":[2],"data_offsets":[32,40]}})";
  expect_refused(write("range.safetensors", safetensors(h, floats(8))), {"'fc.bias'", "outside the data"});
  const std::string backwards = R"({"fc.bias":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})";
  expect_refused(write("back.safetensors", safetensors(backwards, floats(8))), {"'fc.bias'"});
}

TEST_F(WeightsBadInput, BytesNotMatchingDtypeAndShape) {
  const std::string h = R"({"fc.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]},)"
                        R"("fc.bias":{"dtype":"F32","shape":[2],"data_offsets":[24,32]}})";
  expect_refused(write("bytes.safetensors", safetensors(h, floats(8))), {"'fc.weight'", "do not hold F32"});
  // Elements overflowing 64 bits must not wrap into a match.
  const std::string huge = R"({"fc.bias":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})";
  expect_refused(write("huge.safetensors", safetensors(huge, "")), {"'fc.bias'", "do not hold"});
}

TEST_F(WeightsBadInput, ShapeMismatchWithTheModel) {
  const std::string h = R"({"fc.weight":{"dtype":"F32","shape":[3,2],"data_offsets":[0,24]},)"
                        R"("fc.bias":{"dtype":"F32","shape":[2],"data_offsets":[24,32]}})";
  expect_refused(write("shape.safetensors", safetensors(h, floats(8))), {"'fc.weight'", "[3, 2]", "[2, 3]"});
}

TEST_F(WeightsBadInput, UnknownDtype) {
  const std::string h = R"({"fc.weight":{"dtype":"F8_E4M3","shape":[2,3],"data_offsets":[0,6]}})";
  expect_refused(write("dtype.safetensors", safetensors(h, floats(2))), {"'fc.weight'", "F8_E4M3"});
}

TEST_F(WeightsBadInput, NonUtf8Name) {
  const std::string h = "{\"fc.\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  expect_refused(write("utf8.safetensors", safetensors(h, floats(2))), {"not UTF-8"});
}

TEST_F(WeightsBadInput, DuplicateName) {
  const std::string h = R"({"fc.bias":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("fc.bias":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  expect_refused(write("dup.safetensors", safetensors(h, floats(4))), {"'fc.bias'", "twice"});
}

TEST_F(WeightsBadInput, IndexPointsAtMissingFile) {
  write("model-00001-of-00002.safetensors", safetensors(kGood, floats(8)));
  write("model.safetensors.index.json",
        R"({"weight_map":{"fc.weight":"model-00001-of-00002.safetensors","fc.bias":"model-00002-of-00002.safetensors"}})");
  expect_refused(dir_.string(), {"'fc.bias'", "model-00002-of-00002.safetensors", "does not exist"});
}

TEST_F(WeightsBadInput, BinThatIsNotAStateDict) {
  const std::vector<char> list = torch::pickle_save(c10::List<int64_t>({1, 2, 3}));
  expect_refused(write("list.bin", std::string(list.begin(), list.end())), {"not a state dict"});
  c10::Dict<std::string, int64_t> numbers;
  numbers.insert("fc.weight", 3);
  const std::vector<char> dict = torch::pickle_save(numbers);
  expect_refused(write("numbers.bin", std::string(dict.begin(), dict.end())), {"'fc.weight'", "not a tensor"});
  // Python's torch.save(..., _use_new_zipfile_serialization=False) starts with a pickle.
  expect_refused(write("legacy.bin", std::string("\x80\x02\x8a\x0a", 4) + std::string(60, 'x')), {"legacy"});
  expect_refused(write("text.bin", "hello"), {"neither a torch.save zip file nor a safetensors file"});
  const std::string cut = std::string(dict.begin(), dict.begin() + static_cast<long>(dict.size() / 2));
  expect_refused(write("cut.bin", cut), {"zip file"});
}

// The first tensor is fine, the second is not: the first is not loaded either.
TEST_F(WeightsBadInput, NothingChangesWhenOneTensorFails) {
  const std::string h = R"({"fc.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                        R"("fc.bias":{"dtype":"F32","shape":[3],"data_offsets":[24,36]}})";
  expect_refused(write("one.safetensors", safetensors(h, floats(9))), {"'fc.bias'", "[3]"});
}

TEST_F(WeightsBadInput, MissingAndUnexpectedAllReported) {
  const std::string h = R"({"fc.w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                        R"("fc.b":{"dtype":"F32","shape":[2],"data_offsets":[24,32]}})";
  expect_refused(write("names.safetensors", safetensors(h, floats(8))),
                 {"2 parameter(s) missing", "'fc.weight'", "'fc.bias'", "2 tensor(s) in the file", "'fc.w'", "'fc.b'"});
}

}  // namespace

}  // namespace test_weights_bad_input
