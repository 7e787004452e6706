// Async tensor parallelism (shardplan/ring.h, the rule option `overlap`):
// the rings against the collectives they replace, on the local and gloo
// backends; a column + row dense pair under every mode against the
// non-overlapped sequence-parallel path (1e-12) and against the unsharded
// model (tests/parity.h), at model axes 2, 3 and 4, sequence-first and
// batch-first; the example GPT under plans/gpt_async.yaml; the plan option's
// errors and warnings.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "models/model.h"
#include "parity.h"
#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/mappings.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/ring.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"

namespace test_ring {

namespace {

using shardplan::RingDirection;

std::string first(const std::vector<std::string>& f) { return f.empty() ? "" : f[0]; }

// ------------------------------------------------------------ the rings

TEST(Ring, GatherAndReduceScatterEqualTheCollectives) {
  for (const char* backend : {"local", "gloo"})
    for (int n : {2, 3, 4})
      for (auto dir : {RingDirection::Unidirectional, RingDirection::Bidirectional, RingDirection::Split}) {
        SCOPED_TRACE(std::string(backend) + " n=" + std::to_string(n) + " direction " +
                     std::to_string(static_cast<int>(dir)));
        std::mutex mu;
        std::vector<std::string> bad;
        shardplan::run_ranks_in_threads(
            n,
            [&](shardplan::World& w) {
              auto& g = w.comm();
              const int r = g.rank();
              auto mine = torch::arange(6, torch::kDouble).view({2, 3}) + 100 * r;
              // Every owner's features exactly once, whole or in halves.
              std::vector<torch::Tensor> got(n);
              std::vector<int> covered(n, 0);
              shardplan::ring_gather(mine, g, dir, [&](const shardplan::RingPart& p) {
                if (!got[p.owner].defined()) got[p.owner] = torch::full({2, 3}, -1.0, torch::kDouble);
                got[p.owner].narrow(-1, p.begin, p.end - p.begin).copy_(p.data);
                covered[p.owner] += static_cast<int>(p.end - p.begin);
              });
              std::string why;
              for (int k = 0; k < n; ++k)
                if (covered[k] != 3 || !got[k].equal(torch::arange(6, torch::kDouble).view({2, 3}) + 100 * k))
                  why += " gather owner " + std::to_string(k);
              // Partials that differ by owner, rank and feature, summed exactly.
              std::vector<int> asked(n, 0);
              auto partial = [&](int owner, int64_t b, int64_t e) {
                asked[owner] += static_cast<int>(e - b);
                return torch::full({3, e - b}, double(1 << owner) * (r + 1)) +
                       torch::arange(b, e, torch::kDouble).view({1, e - b}) * (r + 1);
              };
              auto rs = shardplan::ring_reduce_scatter(g, dir, 4, partial);
              auto want = (torch::full({3, 4}, double(1 << r)) + torch::arange(4, torch::kDouble).view({1, 4})) *
                          (n * (n + 1) / 2);
              if (!rs.equal(want)) why += " reduce_scatter";
              for (int k = 0; k < n; ++k)
                if (asked[k] != 4) why += " partial of owner " + std::to_string(k) + " asked for " + std::to_string(asked[k]) + " features";
              std::lock_guard<std::mutex> lock(mu);
              if (!why.empty()) bad.push_back("rank " + std::to_string(r) + ":" + why);
            },
            backend);
        EXPECT_TRUE(bad.empty()) << first(bad);
      }
}

// ------------------------------------------------------------ a dense pair

// x -> fc1 (column, ring gather) -> gelu -> fc2 (row, ring scatter) + x.
struct PairImpl : torch::nn::Cloneable<PairImpl> {
  PairImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", shardplan::nn::Linear(8, 24));
    fc2 = register_module("fc2", shardplan::nn::Linear(24, 8));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2->forward(torch::gelu(fc1->forward(x))); }
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Pair);

std::string pair_plan(int dim, const std::string& overlap) {
  return "version: 1\nmesh: {model: auto}\nsequence_parallel: {dim: " + std::to_string(dim) +
         "}\nrules:\n"
         "  - match: 'fc1\\.weight'\n    layout: [model, null]\n    output: sharded\n    overlap: " + overlap + "\n"
         "  - match: 'fc1\\.bias'\n    layout: [model]\n"
         "  - match: 'fc2\\.weight'\n    layout: [null, model]\n    input: sharded\n    overlap: " + overlap + "\n"
         "  - match: 'fc2\\.bias'\n    layout: [null]\n";
}

// The pair on this rank's part of the sequence; the result is gathered so
// every rank returns the whole output (and the input's gradient is whole).
struct PairRun {
  std::vector<torch::Tensor> outputs, input_grads;
  std::map<std::string, torch::Tensor> grads;
};

PairRun run_pair(const std::string& yaml, int n, int dim, const torch::Tensor& x_full, const std::string& backend) {
  torch::manual_seed(4);
  auto model = Pair();
  model->to(torch::kDouble);
  PairRun out;
  out.outputs.resize(n);
  out.input_grads.resize(n);
  std::mutex mu;
  shardplan::run_ranks_in_threads(
      n,
      [&](shardplan::World& w) {
        auto mine = std::dynamic_pointer_cast<PairImpl>(model->clone());
        shardplan::parallelize(*mine, shardplan::parse_plan(yaml, "pair.yaml"), w);
        auto x = x_full.chunk(n, dim)[w.rank()].clone().requires_grad_(true);
        auto y = mine->forward(x);
        (y * torch::linspace(0.5, 1.5, y.numel(), y.options()).view(y.sizes())).sum().backward();
        std::lock_guard<std::mutex> lock(mu);
        out.outputs[w.rank()] = y.detach();
        out.input_grads[w.rank()] = x.grad();
        if (w.rank() == 0)
          for (const auto& p : mine->named_parameters()) out.grads[p.key()] = p.value().grad().clone();
      },
      backend);
  return out;
}

double max_err(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST(Ring, DensePairEqualsTheCollectivePathInEveryMode) {
  for (int dim : {0, 1})
    for (int n : {2, 3, 4}) {
      // [T=12, B=2, 8] or [B=2, T=12, 8].
      torch::manual_seed(9);
      auto x = dim == 0 ? torch::randn({12, 2, 8}, torch::kDouble) : torch::randn({2, 12, 8}, torch::kDouble);
      const PairRun sync = run_pair(pair_plan(dim, "none"), n, dim, x, "local");
      for (const char* mode : {"ring", "ring_bidirectional", "ring_split"}) {
        SCOPED_TRACE(std::string(mode) + " n=" + std::to_string(n) + " dim=" + std::to_string(dim));
        const PairRun ring = run_pair(pair_plan(dim, mode), n, dim, x, "local");
        for (int r = 0; r < n; ++r) {
          EXPECT_LT(max_err(ring.outputs[r], sync.outputs[r]), 1e-12) << "rank " << r;
          EXPECT_LT(max_err(ring.input_grads[r], sync.input_grads[r]), 1e-12) << "rank " << r;
        }
        for (const auto& [name, g] : sync.grads) EXPECT_LT(max_err(ring.grads.at(name), g), 1e-12) << name;
      }
    }
}

TEST(Ring, DensePairOverGlooEqualsTheCollectivePath) {
  torch::manual_seed(9);
  auto x = torch::randn({12, 2, 8}, torch::kDouble);
  const PairRun sync = run_pair(pair_plan(0, "none"), 3, 0, x, "gloo");
  for (const char* mode : {"ring_bidirectional", "ring_split"}) {
    const PairRun ring = run_pair(pair_plan(0, mode), 3, 0, x, "gloo");
    for (int r = 0; r < 3; ++r) {
      EXPECT_LT(max_err(ring.outputs[r], sync.outputs[r]), 1e-12) << mode;
      EXPECT_LT(max_err(ring.input_grads[r], sync.input_grads[r]), 1e-12) << mode;
    }
    for (const auto& [name, g] : sync.grads) EXPECT_LT(max_err(ring.grads.at(name), g), 1e-12) << mode << " " << name;
  }
}

// Against the model unsharded: outputs gathered along the sequence.
TEST(Ring, DensePairMatchesUnsharded) {
  for (const char* mode : {"ring", "ring_bidirectional", "ring_split"})
    for (int n : {2, 3, 4}) {
      SCOPED_TRACE(std::string(mode) + " n=" + std::to_string(n));
      torch::manual_seed(4);
      auto ref = Pair();
      ref->to(torch::kDouble);
      parity::Setup s;
      s.world = n;
      s.steps = 3;
      s.adam = true;
      torch::manual_seed(10);
      for (int i = 0; i < s.steps; ++i) s.inputs.push_back({torch::randn({12, 2, 8}, torch::kDouble)});
      // Every rank gets the whole input, keeps its part and gathers the
      // output, so outputs and input gradients are comparable as wholes.
      s.forward = [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
        auto& pair = dynamic_cast<PairImpl&>(m);
        auto* g = pair.fc1->strategy() ? pair.fc1->strategy()->sharded_output_group() : nullptr;
        if (!g) return pair.forward(in[0]);
        // The loss is the same on every rank, so the output's gradient is
        // whole everywhere: gather_from_group keeps this rank's part of it.
        auto part = shardplan::scatter_to_group(in[0], *g, 0);
        return shardplan::gather_from_group(pair.forward(part), *g, 0);
      };
      s.local = [](const std::string& name, const torch::Tensor& full, int rank, int w) {
        if (name == "fc1.weight" || name == "fc1.bias") return shardplan::shard_of(full, 0, w, rank);
        if (name == "fc2.weight") return shardplan::shard_of(full, 1, w, rank);
        return full;
      };
      auto f = parity::compare(ref.ptr(), shardplan::parse_plan(pair_plan(0, mode), "pair.yaml"), s);
      EXPECT_TRUE(f.empty()) << f.size() << " failures, first: " << first(f);
    }
}

// ------------------------------------------------------------ the GPT

TEST(Ring, GptAsyncMatchesUnsharded) {
  namespace ex = shardplan::examples;
  const ex::Overrides config = {{"vocab", "36"}, {"context", "12"}, {"embed", "24"},
                                {"heads", "12"}, {"layers", "2"},   {"mlp", "24"}};
  std::string text = [] {
    std::ifstream in(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/gpt_async.yaml");
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }();
  ASSERT_NE(text.find("overlap: ring"), std::string::npos);
  for (const std::string mode : {"ring", "ring_bidirectional", "ring_split"})
    for (int n : {2, 3, 4}) {
      SCOPED_TRACE(mode + " n=" + std::to_string(n));
      const std::string yaml = std::regex_replace(text, std::regex("overlap: ring"), "overlap: " + mode);
      torch::manual_seed(3);
      auto ref = std::dynamic_pointer_cast<ex::GPTImpl>(ex::make_model("gpt", config).module);
      ref->to(torch::kDouble);
      parity::Setup s;
      s.world = n;
      s.steps = 3;
      torch::manual_seed(5);
      for (int i = 0; i < s.steps; ++i)
        s.inputs.push_back({torch::randint(36, {3, 12}, torch::kLong), torch::randint(36, {3, 12}, torch::kLong)});
      s.forward = [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
        return dynamic_cast<ex::GPTImpl&>(m).loss({in[0], in[1]});
      };
      s.local = parity::local_by({{"tok_emb\\.weight", {0, 1}},
                                  {".*attn\\.in_proj_(weight|bias)", {0, 3}},
                                  {".*out_proj\\.weight", {1, 1}},
                                  {".*fc1\\.(weight|bias)", {0, 1}},
                                  {".*fc2\\.weight", {1, 1}},
                                  {"head\\.weight", {0, 1}}});
      auto f = parity::compare(ref, shardplan::parse_plan(yaml, "gpt_async.yaml"), s);
      EXPECT_TRUE(f.empty()) << f.size() << " failures, first: " << first(f);
    }
}

// ------------------------------------------------------------ the option

std::string check(const std::string& yaml, int world, std::vector<std::string>* warnings = nullptr) {
  auto model = Pair();
  try {
    auto report = shardplan::check_plan(*model, shardplan::parse_plan(yaml, "pair.yaml"), world);
    if (warnings) *warnings = report.warnings;
  } catch (const shardplan::Error& e) {
    return e.what();
  }
  return "no error";
}

void expect_has(const std::string& got, const std::string& want) {
  EXPECT_NE(got.find(want), std::string::npos) << "got: " << got;
}

TEST(Ring, OverlapOptionErrorsAndWarnings) {
  expect_has(check("mesh: {model: 2}\nrules:\n  - match: 'fc1\\.weight'\n    layout: [model, null]\n"
                   "    output: sharded\n    overlap: ring\n",
                   2),
             "pair.yaml:6:14: option 'overlap' needs sequence parallelism");
  expect_has(check("mesh: {model: 2}\nsequence_parallel: {dim: 0}\nrules:\n  - match: 'fc.\\.(weight|bias)'\n"
                   "    layout: [null]\n    overlap: ring\n",
                   2),
             "layout [null] has 1 dim but parameter 'fc1.weight' has 2 dims");
  expect_has(check("mesh: {model: 2}\nsequence_parallel: {dim: 0}\nrules:\n  - match: 'fc.\\.weight'\n"
                   "    layout: [null, null]\n    overlap: ring\n  - match: 'fc.\\.bias'\n    layout: [null]\n",
                   2),
             "option 'overlap' applies to a column- or row-parallel Linear; this one is replicated");
  try {
    shardplan::parse_plan("mesh: {model: 2}\nrules:\n  - match: 'a'\n    layout: [null]\n    overlap: yes\n", "p.yaml");
    ADD_FAILURE() << "no error";
  } catch (const shardplan::PlanError& e) {
    expect_has(e.what(), "p.yaml:5:14: overlap must be none, ring, ring_bidirectional or ring_split, got 'yes'");
  }
  // Warnings: the pair's shards are small, and bidirectional at 2 ranks is a ring.
  std::vector<std::string> warnings;
  EXPECT_EQ(check(pair_plan(0, "ring_bidirectional"), 2, &warnings), "no error");
  std::string all;
  for (const auto& w : warnings) all += w + "\n";
  expect_has(all, "module 'fc1' (overlap: ring_bidirectional): at 2 ranks a bidirectional ring is a ring");
  expect_has(all, "module 'fc2' (overlap: ring_bidirectional): its weight shard has 96 elements, under 262144");
  EXPECT_EQ(check(pair_plan(0, "ring"), 1, &warnings), "no error");
  all.clear();
  for (const auto& w : warnings) all += w + "\n";
  expect_has(all, "module 'fc1' (overlap: ring): mesh axis 'model' has one rank, nothing to overlap");
}

}  // namespace

}  // namespace test_ring
