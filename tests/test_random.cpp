// Randomness under tensor parallelism: shardplan::nn::Dropout is
// torch::nn::Dropout bit for bit without a tracker; with one, masks agree
// across ranks in replicated regions, differ in sharded ones (along the
// sharding axis only, on a 2-D mesh), repeat for a seed, and ranks that are
// threads of concurrent worlds do not disturb each other.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "shardplan/error.h"
#include "shardplan/nn/dropout.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/random.h"
#include "shardplan/world.h"

namespace test_random {

namespace {

using shardplan::World;

torch::Tensor mask_of(int64_t n = 4096, double p = 0.5) {
  return shardplan::dropout(torch::ones({n}, torch::kDouble), p, true).ne(0);
}

// ------------------------------------------------------------ no tracker

TEST(Dropout, BitIdenticalToTorchWithoutTracker) {
  shardplan::RngTrackerScope none(nullptr);
  for (double p : {0.0, 0.1, 0.5, 0.9, 1.0}) {
    for (bool inplace : {false, true}) {
      for (auto dtype : {torch::kFloat, torch::kDouble}) {
        auto x = torch::randn({7, 13, 5}, dtype);
        torch::nn::Dropout ref(torch::nn::DropoutOptions(p).inplace(inplace));
        shardplan::nn::Dropout ours(torch::nn::DropoutOptions(p).inplace(inplace));
        auto xr = x.clone().requires_grad_(!inplace);
        auto xo = x.clone().requires_grad_(!inplace);
        torch::manual_seed(11);
        auto yr = ref(xr);
        torch::manual_seed(11);
        auto yo = ours(xo);
        ASSERT_TRUE(torch::equal(yr, yo)) << "p=" << p << " inplace=" << inplace;
        if (!inplace) {
          auto g = torch::randn_like(x);
          yr.backward(g);
          yo.backward(g);
          EXPECT_TRUE(torch::equal(xr.grad(), xo.grad())) << "p=" << p;
        }
        // Both left torch's generator in the same state.
        torch::manual_seed(11);
        ref(x.clone());
        const float after_ref = torch::rand({1}).item<float>();
        torch::manual_seed(11);
        ours(x.clone());
        EXPECT_EQ(torch::rand({1}).item<float>(), after_ref) << "p=" << p;
      }
    }
  }
  // Eval mode returns the input itself, as torch's.
  shardplan::nn::Dropout d(0.5);
  d->eval();
  auto x = torch::randn({4});
  EXPECT_TRUE(d(x).is_same(x));
  torch::manual_seed(3);
  auto a = torch::dropout(x, 0.3, true);
  torch::manual_seed(3);
  EXPECT_TRUE(torch::equal(a, shardplan::dropout(x, 0.3, true)));
}

TEST(Dropout, OptionsAndPrinting) {
  shardplan::nn::Dropout d(torch::nn::DropoutOptions(0.25).inplace(true));
  std::ostringstream os;
  os << *d;
  EXPECT_EQ(os.str(), "shardplan::nn::Dropout(p=0.25, inplace=true)");
  EXPECT_TRUE(d->named_parameters().is_empty());
  EXPECT_THROW(shardplan::nn::Dropout(1.5), c10::Error);
  EXPECT_THROW(shardplan::dropout(torch::ones({2}), -0.1, true), c10::Error);
  auto clone = std::dynamic_pointer_cast<shardplan::nn::DropoutImpl>(d->clone());
  ASSERT_TRUE(clone);
  EXPECT_EQ(clone->options.p(), 0.25);
}

TEST(Dropout, ForkWithoutTrackerIsNoop) {
  shardplan::RngTrackerScope none(nullptr);
  shardplan::RngFork fork("model");
  EXPECT_EQ(shardplan::current_rng_fork(), "");
  torch::manual_seed(5);
  auto a = torch::dropout(torch::ones({64}), 0.5, true);
  torch::manual_seed(5);
  EXPECT_TRUE(torch::equal(a, shardplan::dropout(torch::ones({64}), 0.5, true)));
}

// ------------------------------------------------------------ across ranks

// Per rank: the mask drawn in a replicated region, then inside RngFork(axis).
struct Masks {
  std::vector<torch::Tensor> replicated, sharded;
};

Masks draw(int n, uint64_t seed, const shardplan::Mesh& mesh = shardplan::Mesh(), const std::string& axis = "") {
  Masks m;
  m.replicated.resize(n);
  m.sharded.resize(n);
  std::mutex mu;
  shardplan::run_ranks_in_threads(n, [&](World& w) {
    shardplan::manual_seed(w, seed, mesh);
    auto rep = mask_of();
    torch::Tensor sh;
    {
      auto fork = axis.empty() ? std::make_unique<shardplan::RngFork>() : std::make_unique<shardplan::RngFork>(axis);
      sh = mask_of();
    }
    auto rep2 = mask_of();  // back on the replicated stream, which continued
    std::lock_guard<std::mutex> lock(mu);
    m.replicated[w.rank()] = torch::cat({rep, rep2});
    m.sharded[w.rank()] = sh;
  });
  return m;
}

TEST(RngTracker, ReplicatedSameShardedDifferent) {
  for (int n : {1, 2, 4}) {
    Masks m = draw(n, 1234);
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(torch::equal(m.replicated[r], m.replicated[0])) << "world " << n << " rank " << r;
      // About half dropped: the mask is real.
      EXPECT_NEAR(m.sharded[r].to(torch::kDouble).mean().item<double>(), 0.5, 0.05);
      for (int q = 0; q < r; ++q)
        EXPECT_FALSE(torch::equal(m.sharded[r], m.sharded[q])) << "world " << n << " ranks " << q << ", " << r;
      EXPECT_FALSE(torch::equal(m.sharded[r], m.replicated[r].narrow(0, 0, 4096)));
    }
  }
}

TEST(RngTracker, TwoDimensionalMesh) {
  shardplan::Mesh mesh({{"data", 2}, {"model", 2}});  // rank = 2 * data + model
  for (std::string axis : {std::string("model"), std::string("data"), std::string()}) {
    Masks m = draw(4, 99, mesh, axis);
    const std::string along = axis.empty() ? "model" : axis;  // default: last axis
    for (int r = 0; r < 4; ++r) {
      EXPECT_TRUE(torch::equal(m.replicated[r], m.replicated[0]));
      for (int q = 0; q < r; ++q) {
        const bool same_shard = mesh.coord(r, along) == mesh.coord(q, along);
        EXPECT_EQ(torch::equal(m.sharded[r], m.sharded[q]), same_shard)
            << "fork over '" << along << "', ranks " << q << " and " << r;
      }
    }
  }
}

TEST(RngTracker, DeterministicForASeed) {
  Masks a = draw(2, 42), b = draw(2, 42), c = draw(2, 43);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(torch::equal(a.replicated[r], b.replicated[r]));
    EXPECT_TRUE(torch::equal(a.sharded[r], b.sharded[r]));
    EXPECT_FALSE(torch::equal(a.replicated[r], c.replicated[r]));
    EXPECT_FALSE(torch::equal(a.sharded[r], c.sharded[r]));
  }
}

TEST(RngTracker, ConcurrentWorldsDoNotInterfere) {
  const Masks expected = draw(2, 7, shardplan::Mesh(), "world");
  std::vector<Masks> got(3);
  std::vector<std::thread> worlds;
  for (int i = 0; i < 3; ++i) worlds.emplace_back([&, i] { got[i] = draw(2, 7, shardplan::Mesh(), "world"); });
  // Meanwhile someone else uses torch's global generator.
  std::thread noise([] {
    for (int i = 0; i < 200; ++i) torch::rand({256});
  });
  for (auto& t : worlds) t.join();
  noise.join();
  for (const auto& g : got)
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(torch::equal(g.replicated[r], expected.replicated[r]));
      EXPECT_TRUE(torch::equal(g.sharded[r], expected.sharded[r]));
    }
}

TEST(RngTracker, StatesReplay) {
  shardplan::run_ranks_in_threads(2, [](World& w) {
    auto t = shardplan::manual_seed(w, 8);
    auto states = t->get_states();
    auto a = mask_of();
    torch::Tensor b;
    {
      shardplan::RngFork fork;
      b = mask_of();
    }
    t->set_states(states);
    EXPECT_TRUE(torch::equal(a, mask_of()));
    // Sharded streams replay too, each by its own key.
    auto with_sharded = t->get_states();
    ASSERT_EQ(with_sharded.size(), 2u);
    torch::Tensor c;
    {
      shardplan::RngFork fork;
      c = mask_of();
    }
    t->set_states(with_sharded);
    shardplan::RngFork fork;
    EXPECT_TRUE(torch::equal(c, mask_of()));
    EXPECT_FALSE(torch::equal(b, c));
  });
}

TEST(RngTracker, Errors) {
  shardplan::run_ranks_in_threads(2, [](World& w) {
    shardplan::manual_seed(w, 1);
    try {
      shardplan::RngFork fork("model");
      FAIL() << "no error";
    } catch (const shardplan::Error& e) {
      EXPECT_NE(std::string(e.what()).find("'model'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("{world: 2}"), std::string::npos) << e.what();
    }
    EXPECT_THROW(shardplan::manual_seed(w, 1, shardplan::Mesh({{"model", 3}})), shardplan::Error);
  });
}

TEST(RngTracker, BroadcastSeed) {
  shardplan::run_ranks_in_threads(3, [](World& w) {
    EXPECT_EQ(shardplan::broadcast_seed(w, 1000 + w.rank()), 1000u);
    EXPECT_EQ(shardplan::broadcast_seed(w, w.rank() == 0 ? ~uint64_t(0) : 5), ~uint64_t(0));
  });
}

TEST(RngTracker, StaleTrackerIsDropped) {
  std::shared_ptr<shardplan::RngTracker> kept;
  shardplan::run_ranks_in_threads(1, [&](World& w) {
    kept = shardplan::manual_seed(w, 3);
    EXPECT_EQ(shardplan::current_rng_tracker(), kept.get());
  });
  {
    // Its world is gone: made current again, it is ignored.
    shardplan::RngTrackerScope scope(kept);
    EXPECT_EQ(shardplan::current_rng_tracker(), nullptr);
  }
  // A tracker made by hand has no world and stays current in its scope.
  auto t = std::make_shared<shardplan::RngTracker>(3, shardplan::Mesh({{"model", 2}}), 1);
  shardplan::RngTrackerScope scope(t);
  EXPECT_EQ(shardplan::current_rng_tracker(), t.get());
}

// ------------------------------------------------------------ through parallelize

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", shardplan::nn::Linear(8, 16));
    drop_rep = register_module("drop_rep", shardplan::nn::Dropout(0.5));
    drop_shard = register_module("drop_shard", shardplan::nn::Dropout(0.5));
  }
  shardplan::nn::Linear fc1{nullptr};
  shardplan::nn::Dropout drop_rep{nullptr}, drop_shard{nullptr};
};
TORCH_MODULE(Net);

TEST(RngTracker, ParallelizeInstallsTracker) {
  auto plan = shardplan::parse_plan(
      "mesh: {data: 2, model: auto}\nrules:\n"
      "  - match: 'fc1\\.weight'\n    layout: [model, null]\n    output: sharded\n");
  torch::manual_seed(77);
  std::vector<Net> nets;
  for (int r = 0; r < 4; ++r) {
    torch::manual_seed(77);
    nets.emplace_back();
  }
  std::mutex mu;
  std::vector<torch::Tensor> rep(4), shard(4);
  shardplan::run_ranks_in_threads(4, [&](World& w) {
    Net& net = nets[w.rank()];
    shardplan::parallelize(*net, plan, w);
    auto* t = shardplan::current_rng_tracker();
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->seed(), 77u);
    EXPECT_EQ(t->mesh().str(), "{data: 2, model: 2}");
    net->drop_shard->sharded_axis = "model";  // its input is fc1's split output
    auto x = torch::ones({3, 8});
    auto h = net->fc1(x);  // [3, 8] on each rank
    auto a = net->drop_rep(torch::ones({3, 64})).ne(0);
    auto b = net->drop_shard(torch::ones_like(h)).ne(0);
    std::lock_guard<std::mutex> lock(mu);
    rep[w.rank()] = a;
    shard[w.rank()] = b;
  });
  for (int r = 1; r < 4; ++r) EXPECT_TRUE(torch::equal(rep[r], rep[0]));
  EXPECT_TRUE(torch::equal(shard[0], shard[2]));  // same model coordinate
  EXPECT_TRUE(torch::equal(shard[1], shard[3]));
  EXPECT_FALSE(torch::equal(shard[0], shard[1]));
  // A seed set with manual_seed before parallelize is kept.
  shardplan::run_ranks_in_threads(2, [&](World& w) {
    shardplan::manual_seed(w, 5);
    Net net;
    shardplan::parallelize(*net, shardplan::parse_plan("mesh: {model: auto}\nrules: []\n"), w);
    EXPECT_EQ(shardplan::current_rng_tracker()->seed(), 5u);
    EXPECT_EQ(shardplan::current_rng_tracker()->mesh().str(), "{model: 2}");
  });
}

}  // namespace

}  // namespace test_random
