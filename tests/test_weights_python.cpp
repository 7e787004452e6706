// Weights to and from Python (Debian's python3-torch, /usr/bin/python3;
// skipped where it cannot import torch): tests/weights/interop.py writes
// safetensors with its own struct + json writer and torch.save state dicts,
// and the C++ loads them at TP 2 into the GPT (and every dtype into a small
// module) equal to the values Python wrote; Python's own reader checks the
// safetensors C++ saved from TP 2.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>

#include "shardplan/weights.h"
#include "weights_util.h"

namespace test_weights_python {

namespace {

using namespace weights_test;

const std::string kPython = "/usr/bin/python3";
const std::string kScript = std::string(SHARDPLAN_SOURCE_DIR) + "/tests/weights/interop.py";

bool python_has_torch() {
  static const bool has = std::system((kPython + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
  return has;
}

int run(const std::string& args) { return std::system((kPython + " " + kScript + " " + args).c_str()); }

// "name d0,d1" per tensor, in the model's order.
void write_spec(const fs::path& path, const shardplan::StateDict& d) {
  std::ofstream out(path);
  for (const auto& kv : d) {
    out << kv.first << " ";
    for (int64_t i = 0; i < kv.second.dim(); ++i) out << (i ? "," : "") << kv.second.size(i);
    out << "\n";
  }
}

// Raw float64 values, shaped and typed like `like`'s tensors.
shardplan::StateDict read_expected(const fs::path& path, const shardplan::StateDict& like) {
  std::ifstream in(path, std::ios::binary);
  shardplan::StateDict out;
  for (const auto& kv : like) {
    at::Tensor t = torch::empty(kv.second.sizes(), torch::kDouble);
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * 8));
    out.emplace_back(kv.first, t.to(kv.second.scalar_type()));
  }
  EXPECT_TRUE(in) << path << " is shorter than the tensors";
  return out;
}

void write_expected(const fs::path& path, const shardplan::StateDict& d) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& kv : d) {
    const at::Tensor t = kv.second.to(torch::kDouble).contiguous();
    out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * 8));
  }
}

TEST(WeightsPython, PythonFilesLoadAtTP2) {
  if (!python_has_torch()) GTEST_SKIP() << kPython << " cannot import torch (Debian's python3-torch)";
  const fs::path dir = temp_dir("py");
  const auto like = cloned(shardplan::local_state_dict(*gpt(1)));
  write_spec(dir / "spec", like);
  ASSERT_EQ(run("write " + dir.string() + " " + (dir / "spec").string()), 0);
  const auto f32 = read_expected(dir / "expected.f64", like), bf16 = read_expected(dir / "expected_bf16.f64", like);
  EXPECT_FALSE(torch::equal(f32[0].second, bf16[0].second));  // the bf16 file is rounded
  for (const auto& c : std::vector<std::pair<std::string, const shardplan::StateDict*>>{
           {"py.safetensors", &f32}, {"py.bin", &f32}, {"py_bf16.safetensors", &bf16}}) {
    Sharded s = shard_gpt(2, 5);
    for (int r = 0; r < 2; ++r) {
      shardplan::load_weights(*s.models[r], s.reports[r], (dir / c.first).string());
      expect_same(shardplan::local_state_dict(*s.models[r]), shardplan::relocate_state_dict(*c.second, s.reports[r]),
                  c.first + ", rank " + std::to_string(r));
    }
  }
  fs::remove_all(dir);
}

// Parameters a, b, c (float64) and buffers d (float32), i, j (int64), m
// (bool): every dtype of zoo.safetensors converted to them.
struct Zoo : torch::nn::Module {
  Zoo() {
    register_parameter("a", torch::zeros({3}, torch::kDouble));
    register_parameter("b", torch::zeros({2, 2}, torch::kDouble));
    register_parameter("c", torch::zeros({4}, torch::kDouble));
    register_buffer("d", torch::zeros({3}));
    register_buffer("i", torch::zeros({3}, torch::kLong));
    register_buffer("j", torch::zeros({2}, torch::kLong));
    register_buffer("m", torch::zeros({4}, torch::kBool));
  }
};

TEST(WeightsPython, EveryDtypeConvertsToTheModels) {
  if (!python_has_torch()) GTEST_SKIP() << kPython << " cannot import torch (Debian's python3-torch)";
  const fs::path dir = temp_dir("zoo");
  write_spec(dir / "spec", {});
  ASSERT_EQ(run("write " + dir.string() + " " + (dir / "spec").string()), 0);
  for (const char* file : {"zoo.safetensors", "zoo.bin"}) {
    Zoo zoo;
    shardplan::load_weights(zoo, {}, (dir / file).string());
    const auto got = shardplan::local_state_dict(zoo);
    expect_same(got, read_expected(dir / "zoo.f64", got), file);
  }
  fs::remove_all(dir);
}

TEST(WeightsPython, PythonReadsWhatCppSaved) {
  if (!python_has_torch()) GTEST_SKIP() << kPython << " cannot import torch (Debian's python3-torch)";
  const fs::path dir = temp_dir("cpp");
  const auto full = cloned(shardplan::local_state_dict(*gpt(21)));
  shard_gpt(2, 21, [&](shardplan::World& w, torch::nn::Module& m, const shardplan::ParallelReport& r) {
    shardplan::save_weights_safetensors(m, r, w, (dir / "cpp.safetensors").string());
  });
  write_spec(dir / "spec", full);
  write_expected(dir / "expected.f64", full);
  const std::string args = (dir / "cpp.safetensors").string() + " " + (dir / "spec").string() + " ";
  EXPECT_EQ(run("check " + args + (dir / "expected.f64").string()), 0);
  // The checker can fail: one value off.
  auto off = cloned(full);
  off.back().second.view(-1)[0] += 1;
  write_expected(dir / "off.f64", off);
  EXPECT_NE(run("check " + args + (dir / "off.f64").string()), 0);
  fs::remove_all(dir);
}

}  // namespace

}  // namespace test_weights_python
