// WeightsOptions::fused and SaveWeightsOptions::fused (docs/WEIGHTS.md):
// Phi-3's layout, q/k/v in one qkv_proj and gate/up in one gate_up_proj,
// loaded into the Llama example (separate projections) under
// plans/llama.yaml at 1, 2 and 4 thread ranks, kv heads fewer than the
// ranks included, equals loading the split file bit for bit and copies the
// same bytes (a rank reads only its rows of each part); saving re-fuses the
// file bit-exactly; bad rules and files are one line, the model unchanged.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>

#include "../weights_util.h"
#include "models/llama.h"
#include "shardplan/error.h"
#include "shardplan/weights.h"

namespace test_weights_fused {

namespace {

using namespace weights_test;
namespace ex = shardplan::examples;

constexpr int64_t kHeads = 4, kHeadDim = 8, kMlp = 24;

std::shared_ptr<torch::nn::Module> llama(int64_t kv_heads, uint64_t seed) {
  torch::manual_seed(seed);
  auto m = ex::make_model("llama", {{"vocab", "32"}, {"context", "8"}, {"embed", "32"}, {"heads", "4"},
                                    {"kv_heads", std::to_string(kv_heads)}, {"layers", "2"}, {"mlp", "24"}})
               .module;
  m->to(torch::kDouble);
  return m;
}

shardplan::Plan llama_plan() { return shardplan::load_plan(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/llama.yaml"); }

// Phi-3's names for the Llama's tensors: each layer's q, k, v and gate, up
// stacked along dim 0, where the first of them stood.
shardplan::StateDict fused_of(const shardplan::StateDict& split) {
  shardplan::StateDict out;
  std::map<std::string, at::Tensor> by(split.begin(), split.end());
  for (const auto& [name, t] : split) {
    auto at = [&](const std::string& from, const std::string& to) {
      return name.substr(0, name.size() - from.size()) + to;
    };
    auto ends = [&](const std::string& s) { return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
    if (ends("q_proj.weight"))
      out.emplace_back(at("q_proj.weight", "qkv_proj.weight"),
                       torch::cat({t, by[at("q_proj.weight", "k_proj.weight")], by[at("q_proj.weight", "v_proj.weight")]}));
    else if (ends("gate_proj.weight"))
      out.emplace_back(at("gate_proj.weight", "gate_up_proj.weight"), torch::cat({t, by[at("gate_proj.weight", "up_proj.weight")]}));
    else if (!ends("k_proj.weight") && !ends("v_proj.weight") && !ends("up_proj.weight"))
      out.emplace_back(name, t);
  }
  return out;
}

shardplan::WeightsOptions fused_options(int64_t kv_heads) {
  shardplan::WeightsOptions o;
  o.fused = {{R"((model\.layers\.\d+\.self_attn)\.qkv_proj\.weight)",
              {{"$1.q_proj.weight", kHeads * kHeadDim}, {"$1.k_proj.weight", kv_heads * kHeadDim},
               {"$1.v_proj.weight", kv_heads * kHeadDim}}},
             {R"((model\.layers\.\d+\.mlp)\.gate_up_proj\.weight)", {{"$1.gate_proj.weight", kMlp}, {"$1.up_proj.weight", kMlp}}}};
  return o;
}

struct Ranks {
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  std::vector<shardplan::ParallelReport> reports;
};

Ranks shard(int world, int64_t kv_heads, uint64_t seed) {
  Ranks s;
  for (int r = 0; r < world; ++r) s.models.push_back(llama(kv_heads, seed));
  s.reports.resize(world);
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    s.reports[w.rank()] = world == 1 ? shardplan::ParallelReport{} : shardplan::parallelize(*s.models[w.rank()], llama_plan(), w);
  });
  return s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const shardplan::Error& e) {
    return e.what();
  }
  return "(no error)";
}

struct Files {
  fs::path dir;
  shardplan::StateDict whole;
  std::string split, fused;
};

Files write_files(const std::string& tag, int64_t kv_heads, torch::Dtype dtype = torch::kDouble) {
  Files f{temp_dir("fused_" + tag), cloned(shardplan::local_state_dict(*llama(kv_heads, 5))), "", ""};
  shardplan::StateDict stored;
  for (const auto& kv : f.whole) stored.emplace_back(kv.first, kv.second.to(dtype));
  f.split = (f.dir / "split.safetensors").string();
  f.fused = (f.dir / "fused.safetensors").string();
  shardplan::write_safetensors(f.split, stored);
  shardplan::write_safetensors(f.fused, fused_of(stored));
  return f;
}

class FusedWeights : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

TEST_P(FusedWeights, LoadEqualsTheSplitFileAndCopiesOnlyTheShards) {
  const auto [world, kv_heads] = GetParam();
  const Files f = write_files("load" + std::to_string(world) + "_" + std::to_string(kv_heads), kv_heads);
  Ranks from_split = shard(world, kv_heads, 1), from_fused = shard(world, kv_heads, 2);
  for (int r = 0; r < world; ++r) {
    const auto a = shardplan::load_weights(*from_split.models[r], from_split.reports[r], f.split);
    const auto b = shardplan::load_weights(*from_fused.models[r], from_fused.reports[r], f.fused, fused_options(kv_heads));
    EXPECT_TRUE(b.warnings.empty());
    EXPECT_EQ(a.loaded, b.loaded);
    const auto got = shardplan::local_state_dict(*from_fused.models[r]);
    expect_same(got, shardplan::local_state_dict(*from_split.models[r]), "rank " + std::to_string(r));
    expect_same(got, shardplan::relocate_state_dict(f.whole, from_fused.reports[r]), "relocated");
    int64_t shard_bytes = 0;
    for (const auto& kv : got) shard_bytes += kv.second.numel() * kv.second.element_size();
    EXPECT_EQ(b.bytes_copied, shard_bytes);
    EXPECT_EQ(b.bytes_copied, a.bytes_copied);
    // whole_then_slice reads each part whole and gives the same shard.
    auto o = fused_options(kv_heads);
    o.whole_then_slice = true;
    shardplan::load_weights(*from_split.models[r], from_split.reports[r], f.fused, o);
    expect_same(shardplan::local_state_dict(*from_split.models[r]), got, "whole_then_slice");
  }
  if (world == 4) {
    const auto q = shardplan::local_state_dict(*from_fused.models[1]);
    for (const auto& kv : q)
      if (kv.first == "model.layers.0.self_attn.q_proj.weight") EXPECT_EQ(kv.second.size(0), kHeads * kHeadDim / 4);
  }
  fs::remove_all(f.dir);
}

INSTANTIATE_TEST_SUITE_P(RanksAndKvHeads, FusedWeights,
                         ::testing::Values(std::make_tuple(1, 2), std::make_tuple(2, 2), std::make_tuple(4, 4),
                                           std::make_tuple(4, 2), std::make_tuple(4, 1)));

// The fused pattern sees the file's names; the rename rules the rest.
TEST(FusedWeightsCompose, RenamesAndDtypes) {
  const Files f = write_files("compose", 2, torch::kFloat);
  shardplan::StateDict prefixed;
  for (const auto& kv : fused_of(shardplan::read_weights(f.split)))
    prefixed.emplace_back(kv.first.rfind("model.", 0) == 0 ? "base." + kv.first : kv.first, kv.second);
  const std::string file = (f.dir / "prefixed.safetensors").string();
  shardplan::write_safetensors(file, prefixed);
  auto o = fused_options(2);
  o.rename = {{R"(^base\.)", ""}};
  for (auto& rule : o.fused) rule.pattern = R"(base\.)" + rule.pattern;
  Ranks want = shard(2, 2, 1), got = shard(2, 2, 2);
  for (int r = 0; r < 2; ++r) {
    shardplan::load_weights(*want.models[r], want.reports[r], f.split);
    shardplan::load_weights(*got.models[r], got.reports[r], file, o);
    expect_same(shardplan::local_state_dict(*got.models[r]), shardplan::local_state_dict(*want.models[r]), "renamed");
  }
  fs::remove_all(f.dir);
}

TEST(FusedWeightsSave, SavedUnderTPReFusesBitExactly) {
  const Files f = write_files("save", 1);
  Ranks s = shard(2, 1, 3);
  shardplan::SaveWeightsOptions so;
  for (int i = 0; i < 2; ++i) {
    const std::string a = "model.layers." + std::to_string(i) + ".self_attn.", m = "model.layers." + std::to_string(i) + ".mlp.";
    so.fused.push_back({a + "qkv_proj.weight", {a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"}});
    so.fused.push_back({m + "gate_up_proj.weight", {m + "gate_proj.weight", m + "up_proj.weight"}});
  }
  const std::string out = (f.dir / "saved.safetensors").string();
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
    shardplan::load_weights(*s.models[w.rank()], s.reports[w.rank()], f.fused, fused_options(1));
    shardplan::save_weights_safetensors(*s.models[w.rank()], s.reports[w.rank()], w, out, so);
  });
  expect_same(shardplan::read_weights(out), shardplan::read_weights(f.fused), "re-fused");
  // Refused before anything is gathered or written, on every rank alike.
  so.fused.push_back({"x", {"model.layers.0.mlp.gate_proj.weight"}});
  std::vector<std::string> errors(2);
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
    errors[w.rank()] = error_of([&] {
      shardplan::save_weights_safetensors(*s.models[w.rank()], s.reports[w.rank()], w, (f.dir / "no.safetensors").string(), so);
    });
  });
  EXPECT_EQ(errors[0], "SaveWeightsOptions::fused 'x': 'model.layers.0.mlp.gate_proj.weight' is fused twice");
  EXPECT_EQ(errors[1], errors[0]);
  EXPECT_FALSE(fs::exists(f.dir / "no.safetensors"));
  auto refused = [&](const shardplan::SaveWeightsOptions& o) {
    std::vector<std::string> out(2);
    shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
      out[w.rank()] = error_of([&] {
        shardplan::save_weights_safetensors(*s.models[w.rank()], s.reports[w.rank()], w, (f.dir / "no.safetensors").string(), o);
      });
    });
    EXPECT_EQ(out[0], out[1]);
    return out[0];
  };
  shardplan::SaveWeightsOptions bad;
  bad.fused = {{"qkv", {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.kk_proj.weight"}}};
  EXPECT_EQ(refused(bad), "SaveWeightsOptions::fused 'qkv': the model has no parameter "
                          "'model.layers.0.self_attn.kk_proj.weight' to write (a tied one only under its first name)");
  bad.fused = {{"model.norm.weight", {"model.layers.0.self_attn.q_proj.weight"}}};
  EXPECT_EQ(refused(bad), "SaveWeightsOptions::fused: 'model.norm.weight' would be written twice (a fused entry named "
                          "as a model tensor)");
  bad.fused = {{"x", {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"}}};
  EXPECT_NE(refused(bad).find("does not stack on"), std::string::npos);
  EXPECT_FALSE(fs::exists(f.dir / "no.safetensors"));
  fs::remove_all(f.dir);
}

TEST(FusedWeightsBadInput, OneLineAndTheModelUnchanged) {
  const Files f = write_files("bad", 2);
  auto m = llama(2, 9);
  const auto before = cloned(shardplan::local_state_dict(*m));
  auto load = [&](const shardplan::WeightsOptions& o) {
    return error_of([&] { shardplan::load_weights(*m, {}, f.fused, o); });
  };
  auto o = fused_options(1);  // rows for one kv head, the file has two
  EXPECT_EQ(load(o), "weights '" + f.fused + "': tensor 'model.layers.0.self_attn.qkv_proj.weight': WeightsOptions::fused "
                     "'(model\\.layers\\.\\d+\\.self_attn)\\.qkv_proj\\.weight': its parts' rows 32 + 8 + 8 do not sum "
                     "to its 64 rows");
  o = fused_options(2);
  o.fused[1].parts[1].first = "$1.upp_proj.weight";
  EXPECT_NE(load(o).find("in the file the model lacks: 'model.layers.0.mlp.gate_up_proj.weight (part "
                         "model.layers.0.mlp.upp_proj.weight)'"),
            std::string::npos)
      << load(o);
  EXPECT_NE(load(o).find("missing from the file: 'model.layers.0.mlp.up_proj.weight'"), std::string::npos);
  o = fused_options(2);
  o.fused[1].parts[1].first = "$1.gate_proj.weight";
  EXPECT_EQ(load(o), "WeightsOptions::fused '(model\\.layers\\.\\d+\\.mlp)\\.gate_up_proj\\.weight': part name "
                     "'$1.gate_proj.weight' is empty, too long or given twice");
  o = fused_options(2);
  o.fused[1].parts[1].first = "model.norm.weight";  // a part named as another file tensor
  EXPECT_NE(load(o).find("both become 'model.norm.weight'"), std::string::npos) << load(o);
  o = fused_options(2);
  o.fused.push_back({R"(.*qkv_proj\.weight)", {{"a", 64}}});
  EXPECT_NE(load(o).find("matches two WeightsOptions::fused rules"), std::string::npos);
  o = fused_options(2);
  o.fused[0].parts[0].second = 0;
  EXPECT_NE(load(o).find("has 0 rows"), std::string::npos);
  o.fused[0].parts.assign(65, {"x", 1});
  EXPECT_NE(load(o).find("has 65 parts (1 to 64)"), std::string::npos);
  const auto rule = o.fused[1];
  o.fused.assign(1001, rule);
  EXPECT_EQ(load(o), "WeightsOptions::fused has 1001 rules (at most 1000)");
  expect_same(shardplan::local_state_dict(*m), before, "unchanged");
  fs::remove_all(f.dir);
}

}  // namespace

}  // namespace test_weights_fused
