#pragma once
// What the weights tests share (test_weights*.cpp): the example GPT under
// plans/gpt.yaml on thread ranks, and bit-exact comparison of state dicts.
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "models/model.h"
#include "shardplan/checkpoint.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace weights_test {

namespace fs = std::filesystem;

// The GPT with q/k/v fused in one in_proj_weight (blocks = 3 under the plan).
inline std::shared_ptr<torch::nn::Module> gpt(uint64_t seed) {
  torch::manual_seed(seed);
  return shardplan::examples::make_model(
             "gpt", {{"vocab", "32"}, {"context", "8"}, {"embed", "16"}, {"heads", "4"}, {"layers", "2"}, {"mlp", "24"}})
      .module;
}

inline shardplan::Plan gpt_plan() { return shardplan::load_plan(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/gpt.yaml"); }

// One sharded replica of the GPT per rank, parallelized on `world` thread
// ranks; fn(rank, model, report) runs on each rank's thread afterwards.
struct Sharded {
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  std::vector<shardplan::ParallelReport> reports;
};

inline Sharded shard_gpt(int world, uint64_t seed,
                         const std::function<void(shardplan::World&, torch::nn::Module&,
                                                  const shardplan::ParallelReport&)>& fn = nullptr) {
  Sharded s;
  for (int r = 0; r < world; ++r) s.models.push_back(gpt(seed));
  s.reports.resize(world);
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    s.reports[w.rank()] = world == 1 ? shardplan::ParallelReport{} : shardplan::parallelize(*s.models[w.rank()], gpt_plan(), w);
    if (fn) fn(w, *s.models[w.rank()], s.reports[w.rank()]);
  });
  return s;
}

// Every tensor of `got` equals `want`'s of the same name, bit for bit.
inline void expect_same(const shardplan::StateDict& got, const shardplan::StateDict& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].first, want[i].first) << what;
    EXPECT_EQ(got[i].second.scalar_type(), want[i].second.scalar_type()) << what << ": " << got[i].first;
    EXPECT_TRUE(got[i].second.sizes() == want[i].second.sizes() && torch::equal(got[i].second, want[i].second))
        << what << ": " << got[i].first << " differs";
  }
}

inline shardplan::StateDict cloned(const shardplan::StateDict& d) {
  shardplan::StateDict out;
  for (const auto& kv : d) out.emplace_back(kv.first, kv.second.clone());
  return out;
}

inline fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("shardplan_weights_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// A counting CPU allocator: the largest block and the bytes allocated while
// `on`. Install it with c10::SetCPUAllocator and keep it alive (static).
struct CountingAllocator final : c10::Allocator {
  c10::Allocator* inner = c10::GetCPUAllocator();
  std::atomic<bool> on{false};
  std::atomic<int64_t> largest{0}, count{0}, total{0};
  c10::DataPtr allocate(size_t n) const override {
    auto* self = const_cast<CountingAllocator*>(this);
    if (on) {
      ++self->count;
      self->total += static_cast<int64_t>(n);
      int64_t prev = largest.load();
      while (static_cast<int64_t>(n) > prev && !self->largest.compare_exchange_weak(prev, static_cast<int64_t>(n))) {}
    }
    return inner->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner->raw_deleter(); }
};

}  // namespace weights_test
