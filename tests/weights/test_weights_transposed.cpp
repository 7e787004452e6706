// WeightsOptions/SaveWeightsOptions::transposed (docs/WEIGHTS.md, "GPT-2"):
// a file whose 2-D weights are stored [in, out], as GPT-2's Conv1D keeps
// them, loads shard-on-load to the same bits as the pre-transposed file, and
// saves back to the transposed layout bit for bit.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <regex>

#include "shardplan/error.h"
#include "shardplan/weights.h"
#include "../weights_util.h"

namespace test_weights_transposed {

namespace {

using namespace weights_test;

// The example GPT's projections: in_proj (q/k/v fused, blocks: 3 under
// plans/gpt.yaml), out_proj, fc1 and fc2 (column- and row-parallel).
const std::vector<std::string> kTransposed = {R"(blocks\.\d+\.attn\.(in_proj_weight|out_proj\.weight))",
                                              R"(blocks\.\d+\.fc[12]\.weight)"};

bool is_transposed(const std::string& name) {
  for (const auto& p : kTransposed)
    if (std::regex_match(name, std::regex(p))) return true;
  return false;
}

// The GPT of `seed` as two files: `plain` in the model's layout, `conv1d`
// with the projections stored transposed; both in `dtype`.
struct Files {
  std::string plain, conv1d;
  shardplan::StateDict conv1d_tensors;
};
Files write_files(const fs::path& dir, uint64_t seed, at::ScalarType dtype) {
  shardplan::StateDict plain, conv1d;
  for (const auto& kv : shardplan::local_state_dict(*gpt(seed))) {
    const at::Tensor t = kv.second.to(dtype);
    plain.emplace_back(kv.first, t.clone());
    conv1d.emplace_back(kv.first, is_transposed(kv.first) ? t.t().contiguous() : t.clone());
  }
  Files f{(dir / "plain.safetensors").string(), (dir / "conv1d.safetensors").string(), conv1d};
  shardplan::write_safetensors(f.plain, plain);
  shardplan::write_safetensors(f.conv1d, conv1d);
  return f;
}

int64_t shard_bytes(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel() * p.element_size();
  return n;
}

TEST(WeightsTransposed, LoadsAsThePreTransposedFileAtOneTwoFourRanks) {
  const fs::path dir = temp_dir("transposed");
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {  // a float64 file converts into float32 parameters
    const Files f = write_files(dir, 31, dtype);
    for (int world : {1, 2, 4})
      for (bool whole_then_slice : {false, true}) {
        SCOPED_TRACE("world " + std::to_string(world) + " file " + c10::toString(dtype) +
                     (whole_then_slice ? " whole_then_slice" : ""));
        shardplan::WeightsOptions transposed;
        transposed.transposed = kTransposed;
        transposed.whole_then_slice = whole_then_slice;
        std::vector<shardplan::StateDict> want(world), got(world);
        std::vector<int64_t> bytes(world), expected(world);
        shard_gpt(world, 32, [&](shardplan::World& w, torch::nn::Module& m, const shardplan::ParallelReport& r) {
          shardplan::load_weights(m, r, f.plain);
          want[w.rank()] = cloned(shardplan::local_state_dict(m));
        });
        shard_gpt(world, 33, [&](shardplan::World& w, torch::nn::Module& m, const shardplan::ParallelReport& r) {
          bytes[w.rank()] = shardplan::load_weights(m, r, f.conv1d, transposed).bytes_copied;
          expected[w.rank()] = shard_bytes(m);
          got[w.rank()] = cloned(shardplan::local_state_dict(m));
        });
        for (int r = 0; r < world; ++r) {
          expect_same(got[r], want[r], "rank " + std::to_string(r));
          EXPECT_EQ(bytes[r], expected[r]) << "rank " << r << " copied more than its shards";
        }
      }
  }
  fs::remove_all(dir);
}

// Without the option the same file is refused (the transposed shapes do
// not fit): the test above can tell a load that ignores `transposed`.
TEST(WeightsTransposed, WithoutTheOptionTheShapesAreRefused) {
  const fs::path dir = temp_dir("transposed_off");
  const Files f = write_files(dir, 34, at::kFloat);
  auto m = gpt(35);
  EXPECT_THROW(shardplan::load_weights(*m, {}, f.conv1d), shardplan::Error);
  fs::remove_all(dir);
}

TEST(WeightsTransposed, SaveWritesTheTransposedLayoutBitExactly) {
  const fs::path dir = temp_dir("transposed_save");
  const Files f = write_files(dir, 36, at::kFloat);
  const std::string out = (dir / "saved").string();
  shard_gpt(2, 37, [&](shardplan::World& w, torch::nn::Module& m, const shardplan::ParallelReport& r) {
    shardplan::WeightsOptions load;
    load.transposed = kTransposed;
    shardplan::load_weights(m, r, f.conv1d, load);
    shardplan::SaveWeightsOptions save;
    save.transposed = kTransposed;
    shardplan::save_weights_safetensors(m, r, w, out, save);
  });
  expect_same(shardplan::read_weights(out), f.conv1d_tensors, "saved");
  fs::remove_all(dir);
}

TEST(WeightsTransposed, ATensorThatIsNot2DIsOneLineNamingIt) {
  const fs::path dir = temp_dir("transposed_bad");
  const Files f = write_files(dir, 38, at::kFloat);
  auto m = gpt(39);
  const auto before = cloned(shardplan::local_state_dict(*m));
  shardplan::WeightsOptions o;
  o.transposed = {R"(blocks\.0\.fc1\.(weight|bias))"};
  try {
    shardplan::load_weights(*m, {}, f.plain, o);
    ADD_FAILURE() << "a 1-D tensor was loaded transposed";
  } catch (const shardplan::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'blocks.0.fc1.bias'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("plain.safetensors"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  expect_same(shardplan::local_state_dict(*m), before, "after the refused load");
  shardplan::SaveWeightsOptions save;
  save.transposed = o.transposed;
  EXPECT_THROW(shardplan::write_safetensors((dir / "x.safetensors").string(), before, save), shardplan::Error);
  EXPECT_FALSE(fs::exists(dir / "x.safetensors"));
  o.transposed = {"(a"};
  EXPECT_THROW(shardplan::load_weights(*m, {}, f.plain, o), shardplan::Error);
  fs::remove_all(dir);
}

// A file's tensor name is the file's: one with a newline stays one line.
TEST(WeightsTransposed, ANameWithANewlineIsEscapedInTheMessage) {
  const fs::path dir = temp_dir("transposed_newline");
  shardplan::StateDict odd;
  odd.emplace_back("blocks.0.fc1.bias\nx", at::zeros({4}));
  const std::string path = (dir / "odd.safetensors").string();
  shardplan::write_safetensors(path, odd);
  auto m = gpt(40);
  shardplan::WeightsOptions o;
  o.transposed = {R"(blocks\.0\.fc1\.bias\nx)"};
  try {
    shardplan::load_weights(*m, {}, path, o);
    ADD_FAILURE() << "a 1-D tensor was loaded transposed";
  } catch (const shardplan::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'blocks.0.fc1.bias\\x0ax'"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  fs::remove_all(dir);
}

// With rename: the patterns match the names in the file, before renaming.
TEST(WeightsTransposed, PatternsMatchTheFileNamesBeforeRename) {
  const fs::path dir = temp_dir("transposed_rename");
  const Files f = write_files(dir, 40, at::kFloat);
  shardplan::StateDict prefixed;
  for (const auto& kv : f.conv1d_tensors) prefixed.emplace_back("transformer." + kv.first, kv.second);
  const std::string file = (dir / "prefixed.safetensors").string();
  shardplan::write_safetensors(file, prefixed);
  shardplan::WeightsOptions o;
  o.rename = {{"^transformer\\.", ""}};
  for (const auto& p : kTransposed) o.transposed.push_back("transformer\\." + p);
  auto want = gpt(41), got = gpt(42);
  shardplan::load_weights(*want, {}, f.plain);
  shardplan::load_weights(*got, {}, file, o);
  expect_same(shardplan::local_state_dict(*got), shardplan::local_state_dict(*want), "renamed");
  fs::remove_all(dir);
}

}  // namespace

}  // namespace test_weights_transposed
