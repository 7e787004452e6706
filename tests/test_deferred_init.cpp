// Deferred initialisation (shardplan/nn/deferred_init.h): a GPT built under
// DeferredInit allocates no parameter memory, is sharded by plans/gpt.yaml at
// 1, 2 and 4 thread ranks, and load_weights gives it exactly the shards an
// eagerly built model loads; nothing computes with a parameter no load
// filled, even a lenient load, and materialize_deferred gives zeros.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/gpt.h"
#include "shardplan/error.h"
#include "shardplan/nn/deferred_init.h"
#include "shardplan/weights.h"
#include "weights_util.h"

namespace test_deferred_init {

namespace {

using namespace weights_test;
using shardplan::nn::DeferredInit;

int64_t parameter_bytes(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel() * p.element_size();
  return n;
}

// The GPT of weights_util.h, built under DeferredInit (on this thread).
std::shared_ptr<torch::nn::Module> deferred_gpt(at::ScalarType dtype = at::kFloat) {
  DeferredInit deferred(dtype);
  return gpt(5);
}

// One deferred GPT per rank, parallelized on `world` thread ranks.
Sharded shard_deferred(int world) {
  Sharded s;
  for (int r = 0; r < world; ++r) s.models.push_back(deferred_gpt());
  s.reports.resize(world);
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    if (world > 1) s.reports[w.rank()] = shardplan::parallelize(*s.models[w.rank()], gpt_plan(), w);
  });
  return s;
}

// The GPT's logits (vocab-split under a plan) for a fixed batch of tokens.
at::Tensor forward(torch::nn::Module& m) {
  auto* gpt = dynamic_cast<shardplan::examples::GPTImpl*>(&m);
  if (!gpt) throw std::runtime_error("not the example GPT");
  return gpt->forward(torch::arange(16, torch::kLong).remainder(32).view({2, 8}));
}

TEST(DeferredInit, BuildingAllocatesNoParameterMemory) {
  static CountingAllocator counting;  // outlives every tensor it allocates
  c10::Allocator* original = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  counting.on = true;
  auto m = deferred_gpt(at::kDouble);
  counting.on = false;
  c10::SetCPUAllocator(original, 100);
  const int64_t bytes = parameter_bytes(*m);
  EXPECT_LT(counting.total.load(), bytes / 20) << "of " << bytes << " parameter bytes";
  for (const auto& kv : m->named_parameters()) {
    EXPECT_TRUE(shardplan::nn::is_deferred(kv.value())) << kv.key();
    EXPECT_EQ(kv.value().scalar_type(), at::kDouble) << kv.key();
  }
  // Reading one reads zeros (a plugin cutting its shard reads the slice).
  EXPECT_EQ(m->named_parameters()["blocks.0.fc1.weight"].abs().sum().item<double>(), 0.0);
}

class DeferredLoad : public ::testing::TestWithParam<int> {};

TEST_P(DeferredLoad, LoadsTheShardsAnEagerModelLoads) {
  const int world = GetParam();
  const fs::path dir = temp_dir("deferred" + std::to_string(world));
  const auto want = cloned(shardplan::local_state_dict(*gpt(7)));
  shardplan::write_safetensors((dir / "gpt.safetensors").string(), want);
  Sharded s = shard_deferred(world);
  for (int r = 0; r < world; ++r) {
    const auto rep = shardplan::load_weights(*s.models[r], s.reports[r], (dir / "gpt.safetensors").string());
    EXPECT_TRUE(rep.warnings.empty());
    expect_same(shardplan::local_state_dict(*s.models[r]), shardplan::relocate_state_dict(want, s.reports[r]),
                "rank " + std::to_string(r) + " of " + std::to_string(world));
    for (const auto& kv : s.models[r]->named_parameters()) EXPECT_FALSE(shardplan::nn::is_deferred(kv.value())) << kv.key();
  }
  // The loaded model computes what an eagerly built one loaded alike does.
  if (world == 1) {
    auto eager = gpt(9);
    shardplan::load_weights(*eager, {}, (dir / "gpt.safetensors").string());
    EXPECT_TRUE(torch::equal(forward(*s.models[0]), forward(*eager)));
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Worlds, DeferredLoad, ::testing::Values(1, 2, 4));

// A shard cut from a deferred tensor is ordinary memory holding zeros: the
// mark must survive the cut, or forward would compute with them.
TEST(DeferredInit, ForwardBeforeLoadingIsAnError) {
  for (int world : {1, 2}) {
    Sharded s = shard_deferred(world);
    try {
      forward(*s.models[0]);
      ADD_FAILURE() << "forward ran on parameters no load filled, world " << world;
    } catch (const shardplan::Error& e) {
      EXPECT_NE(std::string(e.what()).find("DeferredInit and never filled"), std::string::npos) << e.what();
    }
  }
}

TEST(DeferredInit, LenientLoadStillNeedsEveryParameter) {
  const fs::path dir = temp_dir("deferred_lenient");
  auto want = cloned(shardplan::local_state_dict(*gpt(7)));
  const std::string dropped = want.back().first;
  want.pop_back();
  shardplan::write_safetensors((dir / "gpt.safetensors").string(), want);
  auto m = deferred_gpt();
  shardplan::WeightsOptions lenient;
  lenient.strict = false;
  try {
    shardplan::load_weights(*m, {}, (dir / "gpt.safetensors").string(), lenient);
    ADD_FAILURE() << "a lenient load left '" << dropped << "' without values";
  } catch (const shardplan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + dropped + "'"), std::string::npos) << e.what();
  }
  // Nothing changed: every parameter is still deferred, none was given memory.
  for (const auto& kv : m->named_parameters()) EXPECT_TRUE(shardplan::nn::is_deferred(kv.value())) << kv.key();
  fs::remove_all(dir);
}

TEST(DeferredInit, MaterializeGivesZerosInPlace) {
  auto m = deferred_gpt();
  const at::Tensor w = m->named_parameters()["blocks.0.fc1.weight"];
  const auto names = shardplan::nn::materialize_deferred(*m);
  EXPECT_EQ(names.size(), m->named_parameters().size());
  EXPECT_FALSE(shardplan::nn::is_deferred(w));
  // The same tensor the module holds, now writable memory.
  EXPECT_EQ(w.unsafeGetTensorImpl(), m->named_parameters()["blocks.0.fc1.weight"].unsafeGetTensorImpl());
  torch::NoGradGuard no_grad;
  w.fill_(1.0);
  EXPECT_EQ(w.sum().item<double>(), static_cast<double>(w.numel()));
  EXPECT_NO_THROW(forward(*m));
}

// Model code that initialises a parameter while building under DeferredInit
// writes into the read-only page: the process dies, saying why first.
// (ASan's own SEGV handler may keep ours from being installed.)
#if !defined(__SANITIZE_ADDRESS__)
TEST(DeferredInitDeathTest, WritingIntoADeferredParameterSaysWhy) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_DEATH(
      {
        auto m = deferred_gpt();
        torch::NoGradGuard no_grad;
        m->named_parameters()["blocks.0.fc1.weight"].fill_(1.0);
      },
      "a write into a parameter built under shardplan::nn::DeferredInit");
}
#endif

TEST(DeferredInit, OnlyFloatingDtypes) { EXPECT_THROW(DeferredInit(at::kLong), shardplan::Error); }

}  // namespace

}  // namespace test_deferred_init
