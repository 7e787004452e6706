// Weights in and out (shardplan/weights.h, docs/WEIGHTS.md): safetensors
// saved from a tensor-parallel GPT load at 1, 2 and 4 thread ranks into
// exactly relocate_state_dict's shards of the whole tensors (fused q/k/v
// included), from float32 and from a bfloat16 file; several files with an
// index; torch.save zip files; ties, renames, strictness; and loading never
// allocates a buffer the size of a whole sharded parameter.
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <fstream>

#include "shardplan/error.h"
#include "shardplan/tied.h"
#include "shardplan/weights.h"
#include "weights_util.h"

namespace test_weights {

namespace {

using namespace weights_test;

// The whole GPT's tensors, as a file would hold them.
shardplan::StateDict full_gpt(uint64_t seed) { return cloned(shardplan::local_state_dict(*gpt(seed))); }

// Loads `path` into a fresh GPT at `world` ranks and checks every rank's
// tensors against relocate_state_dict of `want` (the whole tensors).
void expect_loads(const std::string& path, int world, const shardplan::StateDict& want, const std::string& what) {
  Sharded s = shard_gpt(world, 99);
  for (int r = 0; r < world; ++r) {
    const auto rep = shardplan::load_weights(*s.models[r], s.reports[r], path);
    EXPECT_TRUE(rep.warnings.empty()) << what;
    expect_same(shardplan::local_state_dict(*s.models[r]), shardplan::relocate_state_dict(want, s.reports[r]),
                what + ", rank " + std::to_string(r) + " of " + std::to_string(world));
  }
}

class WeightsRoundTrip : public ::testing::TestWithParam<int> {};

// Saved from 2 ranks (gathered), loaded at 1, 2 and 4.
TEST_P(WeightsRoundTrip, SavedUnderTPLoadsShardOnLoad) {
  const int world = GetParam();
  const fs::path dir = temp_dir("rt" + std::to_string(world));
  const auto want = full_gpt(7);
  Sharded src = shard_gpt(2, 7, [&](shardplan::World& w, torch::nn::Module& m, const shardplan::ParallelReport& r) {
    shardplan::save_weights_safetensors(m, r, w, (dir / "gpt.safetensors").string());
  });
  expect_same(shardplan::read_weights((dir / "gpt.safetensors").string()), want, "read back");
  expect_loads((dir / "gpt.safetensors").string(), world, want, "float32 file");
  fs::remove_all(dir);
}

TEST_P(WeightsRoundTrip, Bfloat16FileConvertsOnLoad) {
  const int world = GetParam();
  const fs::path dir = temp_dir("bf" + std::to_string(world));
  auto full = full_gpt(8);
  shardplan::StateDict bf16, want;
  for (const auto& kv : full) {
    bf16.emplace_back(kv.first, kv.second.to(torch::kBFloat16));
    want.emplace_back(kv.first, kv.second.to(torch::kBFloat16).to(torch::kFloat));
  }
  shardplan::write_safetensors((dir / "gpt.safetensors").string(), bf16);
  expect_loads((dir / "gpt.safetensors").string(), world, want, "bfloat16 file");
  // Rounding happened: the test would not notice a load that kept the seed's values.
  EXPECT_FALSE(torch::equal(want[0].second, full[0].second));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Worlds, WeightsRoundTrip, ::testing::Values(1, 2, 4));

TEST(Weights, SplitIntoFilesWithIndex) {
  const fs::path dir = temp_dir("index");
  const auto want = full_gpt(9);
  shardplan::SaveWeightsOptions o;
  o.max_file_bytes = 4096;
  shardplan::write_safetensors((dir / "out").string(), want, o);
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir / "out")) files += e.path().extension() == ".safetensors";
  EXPECT_GT(files, 3);
  EXPECT_TRUE(fs::exists(dir / "out" / "model.safetensors.index.json"));
  expect_loads((dir / "out").string(), 2, want, "index");
  // Saving again under the size leaves one file, and no index to mislead.
  shardplan::write_safetensors((dir / "out").string(), want);
  EXPECT_FALSE(fs::exists(dir / "out" / "model.safetensors.index.json"));
  expect_loads((dir / "out").string(), 4, want, "one file in a directory");
  fs::remove_all(dir);
}

// torch::pickle_save writes the zip format torch.save does (pickled
// OrderedDict of tensors, storages as data/<key> records).
TEST(Weights, TorchZipStateDictLoadsShardOnLoad) {
  const fs::path dir = temp_dir("zip");
  const auto want = full_gpt(10);
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& kv : want) dict.insert(kv.first, kv.second);
  const std::vector<char> bytes = torch::pickle_save(dict);
  std::ofstream(dir / "pytorch_model.bin", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  expect_same(shardplan::read_weights(dir.string()), want, "read back");
  expect_loads(dir.string(), 2, want, "torch zip");
  fs::remove_all(dir);
}

// Shard-on-load's promise: at TP 2 no allocation while loading is as large
// as any sharded parameter whole. Loading whole-then-slice breaks it, which
// shows the hook sees such allocations.
TEST(Weights, LoadingAllocatesNoWholeShardedTensor) {
  const fs::path dir = temp_dir("peak");
  const auto full = full_gpt(11);
  shardplan::StateDict bf16;
  for (const auto& kv : full) bf16.emplace_back(kv.first, kv.second.to(torch::kBFloat16));
  shardplan::write_safetensors((dir / "f32.safetensors").string(), full);
  shardplan::write_safetensors((dir / "bf16.safetensors").string(), bf16);
  Sharded s = shard_gpt(2, 12);
  int64_t smallest_sharded = INT64_MAX, largest_sharded = 0;
  for (const auto& row : s.reports[0].rows) {
    if (row.splits.empty()) continue;
    int64_t bytes = row.element_size;
    for (int64_t d : row.global_shape) bytes *= d;
    smallest_sharded = std::min(smallest_sharded, bytes);
    largest_sharded = std::max(largest_sharded, bytes);
  }
  ASSERT_GT(largest_sharded, 0);
  static CountingAllocator counting;  // outlives every tensor it allocates
  c10::Allocator* original = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  auto measure = [&](const std::string& file, bool whole) {
    shardplan::WeightsOptions o;
    o.whole_then_slice = whole;
    counting.largest = 0;
    counting.on = true;
    for (int r = 0; r < 2; ++r) shardplan::load_weights(*s.models[r], s.reports[r], (dir / file).string(), o);
    counting.on = false;
    return counting.largest.load();
  };
  const int64_t f32 = measure("f32.safetensors", false), bf = measure("bf16.safetensors", false);
  const int64_t whole = measure("f32.safetensors", true);
  c10::SetCPUAllocator(original, 100);
  EXPECT_LT(f32, smallest_sharded) << "a float32 load allocated " << f32 << " bytes at once";
  EXPECT_LT(bf, smallest_sharded) << "a bfloat16 load allocated " << bf << " bytes at once";
  EXPECT_GE(whole, largest_sharded) << "the allocation hook did not see whole-then-slice's copies";
  expect_same(shardplan::local_state_dict(*s.models[1]), shardplan::relocate_state_dict(full, s.reports[1]), "after");
  fs::remove_all(dir);
}

// An LM whose head shares the embedding's weight.
struct TiedLM : torch::nn::Module {
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear head{nullptr};
  TiedLM() {
    emb = register_module("emb", torch::nn::Embedding(6, 4));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(4, 6).bias(false)));
    head->weight = shardplan::tie_parameter(*head, "weight", emb->weight);
  }
};

TEST(Weights, TiedWeightLoadsOnceFromEitherName) {
  const fs::path dir = temp_dir("tied");
  const at::Tensor w = torch::randn({6, 4});
  for (const char* name : {"emb.weight", "head.weight"}) {
    shardplan::write_safetensors((dir / "t.safetensors").string(), {{name, w}});
    TiedLM m;
    const auto rep = shardplan::load_weights(m, {}, (dir / "t.safetensors").string());
    EXPECT_EQ(rep.loaded, std::vector<std::string>{"emb.weight"}) << name;
    EXPECT_TRUE(torch::equal(m.head->weight, w)) << name;
    EXPECT_EQ(m.head->weight.data_ptr(), m.emb->weight.data_ptr()) << name;
  }
  // Both names present (an untied save): one of them is loaded, neither is unexpected.
  shardplan::write_safetensors((dir / "t.safetensors").string(), {{"emb.weight", w}, {"head.weight", w * 2}});
  TiedLM m;
  EXPECT_NO_THROW(shardplan::load_weights(m, {}, (dir / "t.safetensors").string()));
  EXPECT_TRUE(torch::equal(m.emb->weight, w));
  fs::remove_all(dir);
}

TEST(Weights, RenameStrictAndNonStrict) {
  const fs::path dir = temp_dir("rename");
  const auto full = full_gpt(13);
  shardplan::StateDict renamed;
  for (const auto& kv : full) renamed.emplace_back("transformer." + kv.first, kv.second);
  renamed.emplace_back("transformer.rotary.inv_freq", torch::ones({4}));
  const std::string file = (dir / "r.safetensors").string();
  shardplan::write_safetensors(file, renamed);
  auto m = gpt(14);
  const auto before = cloned(shardplan::local_state_dict(*m));
  try {
    shardplan::load_weights(*m, {}, file);
    ADD_FAILURE() << "strict load of renamed weights succeeded";
  } catch (const shardplan::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(std::to_string(full.size()) + " parameter(s) missing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'transformer.rotary.inv_freq'"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  expect_same(shardplan::local_state_dict(*m), before, "after a refused load");
  shardplan::WeightsOptions o;
  o.rename = {{"^transformer\\.", ""}};
  o.strict = false;
  const auto rep = shardplan::load_weights(*m, {}, file, o);
  EXPECT_EQ(rep.unexpected, std::vector<std::string>{"transformer.rotary.inv_freq"});
  EXPECT_EQ(rep.warnings.size(), 1u);
  expect_same(shardplan::local_state_dict(*m), full, "renamed");
  o.strict = true;
  o.rename.emplace_back("^rotary\\..*", "blocks.0.fc1.bias");  // two tensors onto one name
  EXPECT_THROW(shardplan::load_weights(*m, {}, file, o), shardplan::Error);
  fs::remove_all(dir);
}

}  // namespace

namespace {

// `shardplan ckpt convert --from safetensors` then `--to safetensors`: the
// checkpoint loads at TP 2 into relocate_state_dict's shards, and the file
// that comes back is the one that went in, bit for bit.
TEST(Weights, CkptConvertRoundTrip) {
  const fs::path dir = temp_dir("convert");
  const auto want = full_gpt(15);
  shardplan::write_safetensors((dir / "in.safetensors").string(), want);
  const std::string tool = std::string(SHARDPLAN_BINARY_DIR) + "/bin/shardplan-ckpt";
  const std::string plan = std::string(SHARDPLAN_SOURCE_DIR) + "/plans/gpt.yaml";
  ASSERT_EQ(std::system((tool + " convert --from safetensors " + (dir / "in.safetensors").string() + " --out " +
                         (dir / "ck").string() + " --world 2 --plan " + plan + " >/dev/null").c_str()), 0);
  Sharded s = shard_gpt(2, 16, [&](shardplan::World& w, torch::nn::Module& m, const shardplan::ParallelReport& r) {
    shardplan::load_checkpoint((dir / "ck").string(), m, r, w);
  });
  for (int r = 0; r < 2; ++r)
    expect_same(shardplan::local_state_dict(*s.models[r]), shardplan::relocate_state_dict(want, s.reports[r]), "ckpt");
  ASSERT_EQ(std::system((tool + " convert " + (dir / "ck").string() + " --to safetensors " +
                         (dir / "out.safetensors").string() + " >/dev/null").c_str()), 0);
  expect_same(shardplan::read_weights((dir / "out.safetensors").string()), want, "converted back");
  fs::remove_all(dir);
}

}  // namespace

}  // namespace test_weights
