// Activation memory saved for backward, per rank, of the example GPT under
// plans/gpt.yaml (tensor parallel) and plans/gpt_sp.yaml (plus sequence
// parallel), at model axes 1, 2 and 4 (ranks as threads, local backend):
//
//   bench_sp_memory [--config embed=256,...] [--batch 8] [--ranks 1,2,4]
//
// Counted exactly, not sampled: the CPU allocator is wrapped so every
// allocation is charged to the rank thread that made it (the charge travels
// with the block, so a free on another thread credits the right rank).
// "saved" is what is live after the forward and the loss, minus what was
// live before it: the tensors autograd keeps for backward, plus the loss.
// Printed per rank (the largest over ranks) and in units of one [T, B, E]
// activation, so the part sequence parallelism divides by the axis size
// (LayerNorm inputs and outputs, residual sums: whole [T, B, E] tensors on
// every rank under plain tensor parallelism) can be read off the difference;
// docs/BENCHMARKS.md has the reading.
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "../common/counting_allocator.h"
#include "models/corpus.h"
#include "models/gpt.h"
#include "models/model.h"
#include "shardplan/error.h"
#include "shardplan/count_option.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace {

using counting_allocator::Charge;
using counting_allocator::tl_charge;
using counting_allocator::counting;

struct Args {
  std::string config = "context=256,embed=256,heads=8,layers=2,mlp=1024";
  int64_t batch = 8;
  std::vector<int> ranks = {1, 2, 4};
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw shardplan::Error(k + " needs a value");
      return argv[++i];
    };
    if (k == "--config") {
      a.config = next();
    } else if (k == "--batch") {
      a.batch = shardplan::count_or_exit(argv[0], k, next(), 1, INT_MAX);
    } else if (k == "--ranks") {
      a.ranks.clear();
      std::stringstream s(next());
      std::string item;
      while (std::getline(s, item, ','))
        a.ranks.push_back(static_cast<int>(shardplan::count_or_exit(argv[0], k, item, 1, 4096)));
    } else {
      throw shardplan::Error("unknown argument '" + k + "' (--config K=V,..., --batch N, --ranks 1,2,4)");
    }
  }
  return a;
}

struct Result {
  int64_t saved = 0;  // the largest over ranks
  int64_t params = 0;
};

Result measure(const std::shared_ptr<shardplan::examples::GPTImpl>& ref, const std::string& plan_path, int ranks,
               const shardplan::examples::Batch& batch) {
  std::vector<std::shared_ptr<shardplan::examples::GPTImpl>> replicas;
  for (int r = 0; r < ranks; ++r)
    replicas.push_back(std::dynamic_pointer_cast<shardplan::examples::GPTImpl>(ref->clone()));
  const shardplan::Plan plan = shardplan::load_plan(plan_path);
  Result res;
  std::mutex mu;
  shardplan::run_ranks_in_threads(ranks, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    shardplan::parallelize(model, plan, w);
    Charge charge;
    tl_charge = &charge;
    int64_t saved = 0;
    {
      const int64_t before = charge.live;
      at::Tensor loss = model.loss(batch);
      saved = charge.live - before;
      loss.backward();
    }
    tl_charge = nullptr;
    int64_t params = 0;
    for (const auto& p : model.parameters()) params += p.numel() * p.element_size();
    std::lock_guard<std::mutex> lock(mu);
    res.saved = std::max(res.saved, saved);
    res.params = std::max(res.params, params);
  });
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    c10::SetAllocator(c10::DeviceType::CPU, &counting, /*priority=*/255);
    namespace ex = shardplan::examples;
    torch::manual_seed(1);
    auto handle = ex::make_model("gpt", ex::parse_overrides(a.config));
    auto ref = std::dynamic_pointer_cast<ex::GPTImpl>(handle.module);
    const auto& c = ref->config;
    torch::manual_seed(2);
    ex::Batch batch{torch::randint(c.vocab, {a.batch, c.context}, torch::kLong),
                    torch::randint(c.vocab, {a.batch, c.context}, torch::kLong)};
    const std::string dir = SHARDPLAN_SOURCE_DIR "/plans/";
    const double tbe = static_cast<double>(a.batch * c.context * c.embed * 4);  // one [T, B, E] float32 activation
    std::printf("model gpt: %s; batch %lld; float32; one [T, B, E] activation = %.0f bytes\n", c.str().c_str(),
                static_cast<long long>(a.batch), tbe);
    std::printf("%-6s %-16s %16s %12s %12s\n", "ranks", "plan", "saved/rank", "x [T,B,E]", "vs TP");
    for (int n : a.ranks) {
      const Result tp = measure(ref, dir + "gpt.yaml", n, batch);
      const Result sp = measure(ref, dir + "gpt_sp.yaml", n, batch);
      std::printf("%-6d %-16s %16lld %12.2f %12s\n", n, "gpt.yaml", static_cast<long long>(tp.saved), tp.saved / tbe,
                  "1.00");
      std::printf("%-6d %-16s %16lld %12.2f %12.2f\n", n, "gpt_sp.yaml", static_cast<long long>(sp.saved),
                  sp.saved / tbe, static_cast<double>(sp.saved) / static_cast<double>(tp.saved));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sp_memory: error: %s\n", e.what());
    return 1;
  }
}
