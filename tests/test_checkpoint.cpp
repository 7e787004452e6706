// Checkpoints: whole state dicts gathered from shards and cut back into them,
// and sharded checkpoints saved at one world size and loaded at another,
// including optimizer state (the next steps must match an uninterrupted run)
// and every way a checkpoint on disk can be broken.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>

#include "shardplan/checkpoint.h"
#include "shardplan/checkpoint_meta.h"
#include "shardplan/error.h"
#include "shardplan/nn/embedding.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace test_checkpoint {

namespace {

namespace fs = std::filesystem;
using shardplan::StateDict;

// Every kind of cut: column (with a blocked, fused q/k/v), row, an uneven
// vocab-parallel embedding (10 rows over 4 ranks: 3, 3, 3, 1), replicated.
struct NetImpl : torch::nn::Cloneable<NetImpl> {
  NetImpl() { reset(); }
  void reset() override {
    emb = register_module("emb", shardplan::nn::Embedding(10, 8));
    qkv = register_module("qkv", shardplan::nn::Linear(8, 24));
    fc = register_module("fc", shardplan::nn::Linear(24, 8));
    head = register_module("head", shardplan::nn::Linear(8, 3));
  }
  torch::Tensor forward(const torch::Tensor& ids) {
    auto h = emb->forward(ids);
    return head->forward(torch::tanh(fc->forward(torch::tanh(qkv->forward(h)))));
  }
  shardplan::nn::Embedding emb{nullptr};
  shardplan::nn::Linear qkv{nullptr}, fc{nullptr}, head{nullptr};
};
TORCH_MODULE(Net);

const char* kPlan = R"(mesh: {model: auto}
rules:
  - {match: 'emb\.weight', layout: [model, null]}
  - {match: 'qkv\.weight', layout: [model, null], blocks: 3}
  - {match: 'qkv\.bias', layout: [model]}
  - {match: 'fc\.weight', layout: [null, model]}
)";

shardplan::Plan plan(const char* text = kPlan) { return shardplan::parse_plan(text, "ckpt.yaml"); }

Net reference(uint64_t seed = 7) {
  torch::manual_seed(seed);
  Net net;
  net->to(torch::kDouble);
  return net;
}

std::vector<torch::Tensor> batches(int n) {
  torch::manual_seed(11);
  std::vector<torch::Tensor> out;
  for (int i = 0; i < n; ++i) out.push_back(torch::randint(0, 10, {6, 5}, torch::kLong));
  return out;
}

double loss_of(Net& net, const torch::Tensor& ids) { return net->forward(ids).pow(2).mean().item<double>(); }

// Runs `body` on `world` ranks as threads, each with its own clone of `ref`
// parallelized by the plan; returns the first failure message, if any.
template <class F>
std::vector<std::string> on_ranks(int world, const Net& ref, F body, const char* plan_text = kPlan) {
  std::vector<Net> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(std::dynamic_pointer_cast<NetImpl>(ref->clone()));
  std::mutex mu;
  std::vector<std::string> failures;
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    try {
      Net net = replicas[w.rank()];
      auto report = shardplan::parallelize(*net, plan(plan_text), w);
      body(w, net, report);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back("rank " + std::to_string(w.rank()) + ": " + e.what());
    }
  });
  return failures;
}

bool same(const StateDict& a, const StateDict& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || !a[i].second.equal(b[i].second)) return false;
  return true;
}

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("shardplan_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::remove_all(d.string() + ".partial");
  return d;
}

class CollectRelocate : public ::testing::TestWithParam<int> {};

TEST_P(CollectRelocate, RoundTripsThroughWholeTensors) {
  const int world = GetParam();
  Net ref = reference();
  const StateDict expected = shardplan::local_state_dict(*ref);
  auto failures = on_ranks(world, ref, [&](shardplan::World& w, Net& net, const shardplan::ParallelReport& report) {
    StateDict all = shardplan::collect_state_dict(*net, report, w, /*root=*/-1);
    if (!same(all, expected)) throw std::runtime_error("collected state differs from the unsharded model's");
    StateDict at_root = shardplan::collect_state_dict(*net, report, w, /*root=*/0);
    if ((w.rank() == 0) != !at_root.empty()) throw std::runtime_error("root-only collect returned on the wrong ranks");
    StateDict mine = shardplan::relocate_state_dict(expected, report);
    if (!same(mine, shardplan::local_state_dict(*net))) throw std::runtime_error("relocated shards differ");
  });
  EXPECT_TRUE(failures.empty()) << failures.front();
}

// collect_gradients: after one backward, the whole gradients equal one
// process's, by name; a parameter without a gradient anywhere is left out.
TEST_P(CollectRelocate, GradientsAreWholeAsInOneProcess) {
  const int world = GetParam();
  Net ref = reference();
  const torch::Tensor ids = batches(1).front();
  Net plain = std::dynamic_pointer_cast<NetImpl>(ref->clone());
  plain->head->bias.set_requires_grad(false);  // after clone(), which does not keep it
  plain->forward(ids).pow(2).mean().backward();
  StateDict expected;
  for (const auto& p : plain->named_parameters())
    if (p.value().grad().defined()) expected.emplace_back(p.key(), p.value().grad());
  ASSERT_EQ(expected.size(), plain->parameters().size() - 1);
  auto failures = on_ranks(world, ref, [&](shardplan::World& w, Net& net, const shardplan::ParallelReport& report) {
    net->head->bias.set_requires_grad(false);
    net->forward(ids).pow(2).mean().backward();
    StateDict all = shardplan::collect_gradients(*net, report, w, /*root=*/-1);
    if (all.size() != expected.size()) throw std::runtime_error("got " + std::to_string(all.size()) + " gradients");
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i].first != expected[i].first || !all[i].second.allclose(expected[i].second, 1e-12, 1e-12))
        throw std::runtime_error("gradient of " + expected[i].first + " differs");
    StateDict at_root = shardplan::collect_gradients(*net, report, w, /*root=*/0);
    if ((w.rank() == 0) != !at_root.empty()) throw std::runtime_error("root-only collect returned on the wrong ranks");
  });
  EXPECT_TRUE(failures.empty()) << failures.front();
}

TEST_P(CollectRelocate, CollectedStateLoadsIntoThePlainModel) {
  const int world = GetParam();
  Net ref = reference();
  StateDict collected;
  auto failures = on_ranks(world, ref, [&](shardplan::World& w, Net& net, const shardplan::ParallelReport& report) {
    {
      torch::NoGradGuard no_grad;
      for (auto& p : net->parameters()) p.add_(1.0);  // something the plain model does not have yet
    }
    auto all = shardplan::collect_state_dict(*net, report, w, 0);
    if (w.rank() == 0) collected = all;
  });
  ASSERT_TRUE(failures.empty()) << failures.front();
  Net plain = reference();
  shardplan::load_state_dict(*plain, collected);
  for (const auto& p : ref->named_parameters())
    EXPECT_TRUE(plain->named_parameters()[p.key()].equal(p.value() + 1.0)) << p.key();
}

INSTANTIATE_TEST_SUITE_P(World, CollectRelocate, ::testing::Values(1, 2, 4));

// Save at `from` ranks after some Adam steps; load at `to` ranks into a fresh
// model and optimizer; the next steps' losses must equal an uninterrupted run.
struct Resharding {
  int from, to;
};
class Reshard : public ::testing::TestWithParam<Resharding> {};

TEST_P(Reshard, ResumesWithIdenticalLosses) {
  const auto [from, to] = GetParam();
  const auto data = batches(6);
  const fs::path dir = fresh_dir("reshard_" + std::to_string(from) + "_" + std::to_string(to));
  Net ref = reference();

  // Uninterrupted: 6 steps unsharded.
  std::vector<double> want;
  {
    Net net = std::dynamic_pointer_cast<NetImpl>(ref->clone());
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-2));
    for (const auto& ids : data) {
      opt.zero_grad();
      auto loss = net->forward(ids).pow(2).mean();
      want.push_back(loss.item<double>());
      loss.backward();
      opt.step();
    }
  }
  // 3 steps at `from`, save.
  auto f1 = on_ranks(from, ref, [&](shardplan::World& w, Net& net, const shardplan::ParallelReport& report) {
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-2));
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      net->forward(data[s]).pow(2).mean().backward();
      opt.step();
    }
    shardplan::CheckpointOptions o;
    o.optimizer = &opt;
    o.attributes["step"] = "3";
    shardplan::save_checkpoint(dir.string(), *net, report, w, o);
  });
  ASSERT_TRUE(f1.empty()) << f1.front();
  // Load at `to` into a differently initialised model, 3 more steps.
  torch::manual_seed(99);
  Net other;
  other->to(torch::kDouble);
  std::vector<std::vector<double>> got(to);
  auto f2 = on_ranks(to, other, [&](shardplan::World& w, Net& net, const shardplan::ParallelReport& report) {
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-2));
    shardplan::CheckpointOptions o;
    o.optimizer = &opt;
    auto attrs = shardplan::load_checkpoint(dir.string(), *net, report, w, o);
    if (attrs["step"] != "3") throw std::runtime_error("attribute 'step' lost");
    for (int s = 3; s < 6; ++s) {
      opt.zero_grad();
      auto loss = net->forward(data[s]).pow(2).mean();
      got[w.rank()].push_back(loss.item<double>());
      loss.backward();
      opt.step();
    }
  });
  ASSERT_TRUE(f2.empty()) << f2.front();
  for (int r = 0; r < to; ++r)
    for (int s = 0; s < 3; ++s) EXPECT_NEAR(got[r][s], want[3 + s], 1e-12 * std::abs(want[3 + s])) << "rank " << r << " step " << 3 + s;
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Worlds, Reshard,
                         ::testing::Values(Resharding{2, 2}, Resharding{2, 1}, Resharding{2, 4}, Resharding{4, 2},
                                           Resharding{1, 4}),
                         [](const ::testing::TestParamInfo<Resharding>& i) {
                           return "from" + std::to_string(i.param.from) + "_to" + std::to_string(i.param.to);
                         });

// --------------------------------------------------------------- broken disks

class Broken : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fresh_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    auto f = on_ranks(2, reference(), [&](shardplan::World& w, Net& net, const shardplan::ParallelReport& report) {
      shardplan::save_checkpoint(dir.string(), *net, report, w);
    });
    ASSERT_TRUE(f.empty()) << f.front();
  }
  void TearDown() override {
    fs::remove_all(dir);
    fs::remove_all(dir.string() + ".partial");  // what a failed save would leave if it did not clean up
  }
  // The error loading gives, the same on every rank; a failed load must
  // leave every rank's model as it was. `tweak` may change a rank's model
  // after parallelize.
  std::string load_error(int world = 2, Net model = reference(),
                         std::function<void(int, Net&)> tweak = nullptr) {
    std::vector<std::string> errors;
    std::mutex mu;
    on_ranks(world, model, [&](shardplan::World& w, Net& net, const shardplan::ParallelReport& report) {
      if (tweak) tweak(w.rank(), net);
      StateDict before;
      for (const auto& kv : shardplan::local_state_dict(*net)) before.emplace_back(kv.first, kv.second.clone());
      try {
        shardplan::load_checkpoint(dir.string(), *net, report, w);
      } catch (const shardplan::Error& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(e.what());
        if (!same(before, shardplan::local_state_dict(*net)))
          errors.push_back("rank " + std::to_string(w.rank()) + " changed its model in a failed load");
      }
    });
    if (errors.size() != static_cast<size_t>(world)) return "not every rank failed (or one changed its model)";
    return errors[0];
  }
  fs::path dir;
};

TEST_F(Broken, FlippedByteIsAChecksumError) {
  const fs::path f = dir / "rank-00001.bin";
  std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(5);
  char c = 0;
  io.seekg(5);
  io.read(&c, 1);
  c ^= 0x10;
  io.seekp(5);
  io.write(&c, 1);
  io.close();
  EXPECT_THAT(load_error(), ::testing::HasSubstr("rank-00001.bin' is corrupted: checksum"));
}

TEST_F(Broken, TruncatedFileSaysSo) {
  fs::resize_file(dir / "rank-00000.bin", 10);
  EXPECT_THAT(load_error(1), ::testing::HasSubstr("rank-00000.bin' is truncated"));
}

TEST_F(Broken, MissingRankFileNamesIt) {
  fs::remove(dir / "rank-00001.bin");
  EXPECT_THAT(load_error(4), ::testing::HasSubstr("rank-00001.bin' is missing"));
}

TEST_F(Broken, MissingMetadataIsNotACheckpoint) {
  fs::remove(dir / "metadata.yaml");
  EXPECT_THAT(load_error(), ::testing::HasSubstr("not a complete checkpoint"));
}

TEST_F(Broken, DifferentModelNamesTheParameter) {
  torch::manual_seed(1);
  Net wide;
  wide->qkv = wide->replace_module("qkv", shardplan::nn::Linear(8, 24));
  wide->head = wide->replace_module("head", shardplan::nn::Linear(8, 5));
  wide->to(torch::kDouble);
  EXPECT_THAT(load_error(2, wide), ::testing::HasSubstr("'head.weight': the checkpoint's shape is [3, 8], the model's [5, 8]"));
}

// Every file of a directory and its bytes.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& f : fs::directory_iterator(dir)) {
    std::ifstream in(f.path(), std::ios::binary);
    out[f.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  return out;
}

TEST_F(Broken, FailedSaveLeavesThePreviousCheckpoint) {
  const auto files = snapshot(dir);
  const std::string before = [&] {
    std::ifstream in(dir / "metadata.yaml");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  // A save that fails half way, after the staging directory exists: rank 0
  // holds a tensor checkpoints cannot store.
  Net changed = reference();
  {
    torch::NoGradGuard g;
    for (auto& p : changed->parameters()) p.mul_(2);
  }
  std::vector<std::string> errors;
  std::mutex mu;
  on_ranks(2, changed, [&](shardplan::World& w, Net& net, const shardplan::ParallelReport& report) {
    if (w.rank() == 0) net->register_buffer("odd", torch::zeros({2}, torch::kComplexFloat));
    try {
      shardplan::save_checkpoint(dir.string(), *net, report, w);
    } catch (const shardplan::Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(e.what());
    }
  });
  EXPECT_EQ(errors.size(), 2u);
  EXPECT_EQ(snapshot(dir), files) << "a file of the previous checkpoint changed";
  EXPECT_FALSE(fs::exists(dir.string() + ".partial")) << "the failed save left its staging directory";
  std::ifstream in(dir / "metadata.yaml");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), before);
  EXPECT_EQ(load_error(), "not every rank failed (or one changed its model)");  // the old checkpoint still loads
}

TEST_F(Broken, OneRanksMismatchChangesNoRank) {
  // Rank 1's model has a buffer the checkpoint lacks; rank 0's would load
  // fine but must not, since its peers cannot.
  EXPECT_THAT(load_error(2, reference(),
                         [](int rank, Net& net) {
                           if (rank == 1) net->fc->register_buffer("extra", torch::zeros({2}, torch::kDouble));
                         }),
              ::testing::HasSubstr("rank 1: the checkpoint has no tensor 'fc.extra'"));
}

TEST_F(Broken, MissingOptimizerStateChangesNothing) {
  // The parameters would load; the optimizer state is missing (saved without
  // one): neither model nor optimizer may change.
  std::vector<std::string> errors;
  std::mutex mu;
  torch::manual_seed(5);
  Net other;
  other->to(torch::kDouble);
  on_ranks(2, other, [&](shardplan::World& w, Net& net, const shardplan::ParallelReport& report) {
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-2));
    opt.zero_grad();
    net->forward(batches(1)[0]).pow(2).mean().backward();
    opt.step();
    StateDict before;
    for (const auto& kv : shardplan::local_state_dict(*net)) before.emplace_back(kv.first, kv.second.clone());
    const size_t states = opt.state().size();
    shardplan::CheckpointOptions o;
    o.optimizer = &opt;
    try {
      shardplan::load_checkpoint(dir.string(), *net, report, w, o);
    } catch (const shardplan::Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(e.what());
      if (!same(before, shardplan::local_state_dict(*net)) || opt.state().size() != states)
        errors.push_back("changed");
    }
  });
  ASSERT_EQ(errors.size(), 2u) << ::testing::PrintToString(errors);
  EXPECT_THAT(errors[0], ::testing::HasSubstr("the checkpoint has no optimizer state (saved without an optimizer)"));
}

TEST_F(Broken, AnotherModelIsRefusedWholesale) {
  // Same parameter names up to the last one, which is missing.
  struct OtherImpl : torch::nn::Cloneable<OtherImpl> {
    OtherImpl() { reset(); }
    void reset() override {
      emb = register_module("emb", shardplan::nn::Embedding(10, 8));
      qkv = register_module("qkv", shardplan::nn::Linear(8, 24));
      fc = register_module("fc", shardplan::nn::Linear(24, 8));
      tail = register_module("tail", shardplan::nn::Linear(8, 3));
    }
    shardplan::nn::Embedding emb{nullptr};
    shardplan::nn::Linear qkv{nullptr}, fc{nullptr}, tail{nullptr};
  };
  torch::manual_seed(3);
  auto other = std::make_shared<OtherImpl>();
  other->to(torch::kDouble);
  const StateDict before = [&] {
    StateDict b;
    for (const auto& kv : shardplan::local_state_dict(*other)) b.emplace_back(kv.first, kv.second.clone());
    return b;
  }();
  std::string error;
  shardplan::run_ranks_in_threads(1, [&](shardplan::World& w) {
    try {
      shardplan::load_checkpoint(dir.string(), *other, shardplan::ParallelReport{}, w);
    } catch (const shardplan::Error& e) {
      error = e.what();
    }
  });
  EXPECT_THAT(error, ::testing::HasSubstr("the checkpoint has no tensor 'tail.weight'"));
  EXPECT_TRUE(same(before, shardplan::local_state_dict(*other))) << "emb, qkv and fc were loaded anyway";
}

// A plan that cuts the same global shapes differently is a resharding, not
// an error: qkv unsplit, fc column- instead of row-parallel.
TEST_F(Broken, DifferentLayoutsAreResharding) {
  const char* other_plan = R"(mesh: {model: auto}
rules:
  - {match: 'emb\.weight', layout: [null, model]}
  - {match: 'fc\.weight', layout: [model, null]}
  - {match: 'fc\.bias', layout: [model]}
)";
  torch::manual_seed(5);
  Net other;
  other->to(torch::kDouble);
  const StateDict expected = shardplan::local_state_dict(*reference());
  std::vector<Net> replicas{std::dynamic_pointer_cast<NetImpl>(other->clone()),
                            std::dynamic_pointer_cast<NetImpl>(other->clone())};
  std::vector<std::string> failures;
  std::mutex mu;
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
    try {
      Net net = replicas[w.rank()];
      auto report = shardplan::parallelize(*net, shardplan::parse_plan(other_plan, "other.yaml"), w);
      shardplan::load_checkpoint(dir.string(), *net, report, w);
      if (!same(shardplan::collect_state_dict(*net, report, w, -1), expected))
        throw std::runtime_error("loaded state differs from the saved model's");
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(e.what());
    }
  });
  EXPECT_TRUE(failures.empty()) << failures.front();
}

// Offline resharding (shardplan ckpt convert): 2 -> 4 -> 1 (in place), each
// loading to the saved model; a corrupted source writes nothing.
TEST_F(Broken, ReshardOfflineThenLoad) {
  const StateDict expected = shardplan::local_state_dict(*reference());
  const fs::path four = dir.string() + "_4";
  fs::remove_all(four);
  shardplan::reshard_checkpoint(dir.string(), four.string(), 4);
  auto failures = on_ranks(4, reference(99), [&](shardplan::World& w, Net& net, const shardplan::ParallelReport& report) {
    shardplan::load_checkpoint(four.string(), *net, report, w);
    if (!same(shardplan::collect_state_dict(*net, report, w, -1), expected))
      throw std::runtime_error("resharded state differs");
  });
  EXPECT_TRUE(failures.empty()) << failures.front();
  EXPECT_TRUE(fs::exists(four / "rank-00003.bin"));
  shardplan::reshard_checkpoint(four.string(), four.string(), 1);
  EXPECT_FALSE(fs::exists(four / "rank-00001.bin"));
  EXPECT_FALSE(fs::exists(four.string() + ".partial"));
  EXPECT_TRUE(same(shardplan::read_checkpoint(four.string()), expected));
  fs::remove_all(four);

  fs::resize_file(dir / "rank-00001.bin", 8);
  try {
    shardplan::reshard_checkpoint(dir.string(), four.string(), 4);
    ADD_FAILURE() << "no error";
  } catch (const shardplan::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("rank-00001.bin' is truncated"));
  }
  EXPECT_FALSE(fs::exists(four));
  EXPECT_FALSE(fs::exists(four.string() + ".partial")) << "the failed reshard left its staging directory";
}

// ------------------------------------------------------------------ metadata

std::string file_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// qkv.bias without a rule of its own follows qkv.weight (3 blocks): the
// metadata records the layout it was cut with, [model], not [null]; the
// checkpoint loads back under the same plan, and, layouts being
// informational, one saved before with [null] there loads under kPlan.
TEST(CheckpointMeta, InferredBiasIsRecordedWithTheLayoutItWasCutWith) {
  const char* no_bias_rule = R"(mesh: {model: auto}
rules:
  - {match: 'emb\.weight', layout: [model, null]}
  - {match: 'qkv\.weight', layout: [model, null], blocks: 3}
  - {match: 'fc\.weight', layout: [null, model]}
)";
  const fs::path dir = fresh_dir("inferred_bias");
  const StateDict expected = shardplan::local_state_dict(*reference());
  auto save = [&](shardplan::World& w, Net& net, const shardplan::ParallelReport& report) {
    shardplan::save_checkpoint(dir.string(), *net, report, w);
  };
  auto load = [&](shardplan::World& w, Net& net, const shardplan::ParallelReport& report) {
    shardplan::load_checkpoint(dir.string(), *net, report, w);
    if (!same(shardplan::collect_state_dict(*net, report, w, -1), expected))
      throw std::runtime_error("loaded state differs from the saved model's");
  };
  auto failures = on_ranks(2, reference(), save, no_bias_rule);
  ASSERT_TRUE(failures.empty()) << failures.front();
  const fs::path meta_file = dir / shardplan::ckpt::kMetaFile;
  shardplan::ckpt::Meta meta = shardplan::ckpt::parse_meta(file_text(meta_file), meta_file.string());
  const shardplan::ckpt::TensorEntry* bias = meta.find("qkv.bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->layout, "[model]");
  ASSERT_EQ(bias->pieces.size(), 2u);
  for (const auto& piece : bias->pieces) {
    EXPECT_EQ(piece.shape, (std::vector<int64_t>{12}));
    ASSERT_EQ(piece.split.size(), 1u);
    EXPECT_EQ(piece.split[0].dim, 0);
    EXPECT_EQ(piece.split[0].axis, "model");
    EXPECT_EQ(piece.split[0].parts, 2);
    EXPECT_EQ(piece.split[0].index, piece.rank);
    EXPECT_EQ(piece.split[0].blocks, 3);
  }
  EXPECT_EQ(meta.find("head.bias")->layout, "[null]");
  failures = on_ranks(2, reference(99), load, no_bias_rule);
  EXPECT_TRUE(failures.empty()) << failures.front();

  for (auto& t : meta.tensors)
    if (t.name == "qkv.bias") t.layout = "[null]";
  const std::string old = shardplan::ckpt::to_yaml(meta);
  shardplan::ckpt::write_file_atomic(meta_file.string(), old.data(), old.size());
  failures = on_ranks(2, reference(99), load);
  EXPECT_TRUE(failures.empty()) << failures.front();
  fs::remove_all(dir);
}

TEST(CheckpointMeta, RejectsPiecesThatDoNotPartitionTheTensor) {
  const std::string good = R"(format_version: 1
world_size: 2
mesh: {model: 2}
tensors:
  - name: w
    dtype: float32
    shape: [5, 2]
    pieces:
      - {rank: 0, file: a.bin, offset: 0, nbytes: 24, shape: [3, 2], split: [{dim: 0, axis: model, parts: 2, index: 0, blocks: 1}], crc32c: 1}
      - {rank: 1, file: b.bin, offset: 0, nbytes: 16, shape: [2, 2], split: [{dim: 0, axis: model, parts: 2, index: 1, blocks: 1}], crc32c: 2}
)";
  auto meta = shardplan::ckpt::parse_meta(good, "m.yaml");
  ASSERT_EQ(meta.tensors.size(), 1u);
  EXPECT_EQ(shardplan::ckpt::parse_meta(shardplan::ckpt::to_yaml(meta), "again").tensors[0].pieces.size(), 2u);
  auto broken = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    try {
      shardplan::ckpt::parse_meta(s, "m.yaml");
    } catch (const shardplan::Error& e) {
      return std::string(e.what());
    }
    return std::string("parsed");
  };
  EXPECT_THAT(broken("index: 1", "index: 0"), ::testing::HasSubstr("m.yaml:10:"));
  EXPECT_THAT(broken("index: 1", "index: 0"), ::testing::HasSubstr("two pieces hold the same part"));
  EXPECT_THAT(broken("shape: [2, 2]", "shape: [3, 2]"), ::testing::HasSubstr("piece shape disagrees with its split"));
  EXPECT_THAT(broken("nbytes: 16", "nbytes: 15"), ::testing::HasSubstr("nbytes disagrees"));
  EXPECT_THAT(broken("file: b.bin", "file: ../b.bin"), ::testing::HasSubstr("must be a plain file name"));
  EXPECT_THAT(broken("format_version: 1", "format_version: 9"), ::testing::HasSubstr("format version 9 is not supported"));
  EXPECT_THAT(broken("axis: model, parts: 2, index: 1", "axis: data, parts: 2, index: 1"),
              ::testing::HasSubstr("which the mesh does not have"));
  EXPECT_THAT(broken("dtype: float32", "dtype: complex"), ::testing::HasSubstr("unknown dtype"));
  // Found by the fuzzer: yaml-cpp writes bytes that are not UTF-8 as U+FFFD,
  // so such a name would change when the metadata is written back.
  EXPECT_THAT(broken("name: w", "name: \"w\xe8\""), ::testing::HasSubstr("m.yaml:5:11: 'name' is not valid UTF-8"));
  EXPECT_THAT(broken("mesh: {model: 2}", "mesh: {model: 2}\nattributes: {\"k\xc0\xaf\": v}"),
              ::testing::HasSubstr("an attribute name is not valid UTF-8"));
  EXPECT_EQ(broken("name: w", "name: \"w\xc3\xa9\""), "parsed");
}

// Two kv heads over 4 ranks: each piece held by 2 ranks, written once.
TEST(CheckpointMeta, SharedPiecesNeedPartsTimesSharedToBeTheAxis) {
  const std::string good = R"(format_version: 1
world_size: 4
mesh: {model: 4}
tensors:
  - name: k
    dtype: float32
    shape: [2, 2]
    pieces:
      - {rank: 0, file: a.bin, offset: 0, nbytes: 8, shape: [1, 2], split: [{dim: 0, axis: model, parts: 2, index: 0, blocks: 1, shared: 2}], crc32c: 1}
      - {rank: 2, file: c.bin, offset: 0, nbytes: 8, shape: [1, 2], split: [{dim: 0, axis: model, parts: 2, index: 1, blocks: 1, shared: 2}], crc32c: 2}
)";
  const auto meta = shardplan::ckpt::parse_meta(good, "m.yaml");
  EXPECT_EQ(meta.tensors.at(0).pieces.at(1).split.at(0).shared, 2);
  EXPECT_EQ(shardplan::ckpt::parse_meta(shardplan::ckpt::to_yaml(meta), "again").tensors[0].pieces[1].split[0].shared, 2);
  std::string three = good;
  for (size_t at = three.find("shared: 2"); at != std::string::npos; at = three.find("shared: 2", at))
    three.replace(at, 9, "shared: 3");
  EXPECT_THROW(
      try { shardplan::ckpt::parse_meta(three, "m.yaml"); } catch (const shardplan::Error& e) {
        EXPECT_THAT(e.what(), ::testing::HasSubstr("m.yaml:9:"));
        EXPECT_THAT(e.what(), ::testing::HasSubstr("in 2 parts each on 3 ranks, which the mesh does not have"));
        throw;
      },
      shardplan::Error);
}

// Found by the fuzzer: a plan holding a NUL byte was written as a literal
// block, which ends the document there, and the metadata read back lost
// everything after the plan. Text a literal block or a plain key cannot hold
// is written double-quoted. (Any text: YAML is UTF-8, and the plan saved is
// what yaml-cpp read from the plan file.)
TEST(CheckpointMeta, AnyPlanTextAndAttributeNameSurviveARoundTrip) {
  shardplan::ckpt::Meta meta;
  meta.format_version = 1;
  meta.world_size = 1;
  shardplan::ckpt::TensorEntry t;
  t.name = "w";
  t.dtype = "float32";
  t.shape = {2};
  shardplan::ckpt::Piece p;
  p.rank = 0;
  p.file = "a.bin";
  p.nbytes = 8;
  p.shape = {2};
  t.pieces.push_back(p);
  meta.tensors.push_back(t);
  for (const std::string plan : {std::string("rules: []\n"), std::string("mesh: {m\0x: 1}\n", 15),
                                 std::string("  leading spaces\n"), std::string("tab\there\r\n\x7f caf\xc3\xa9"), std::string("no final line break"),
                                 std::string("two\n\n"), std::string("\nleading line break\n"), std::string()}) {
    meta.plan = plan;
    meta.attributes = {{std::string("key\0\n", 5), "v"}, {"optimizer", "adam"}};
    const auto again = shardplan::ckpt::parse_meta(shardplan::ckpt::to_yaml(meta), "again.yaml");
    EXPECT_EQ(again.plan, plan);
    EXPECT_EQ(again.attributes, meta.attributes);
    ASSERT_EQ(again.tensors.size(), 1u);
  }
}

TEST(CheckpointMeta, Crc32cKnownValue) {
  // RFC 3720 B.4: 32 bytes of zeros.
  std::vector<unsigned char> zeros(32, 0);
  EXPECT_EQ(shardplan::ckpt::crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(shardplan::ckpt::crc32c("123456789", 9), 0xE3069283u);
}

}  // namespace

}  // namespace test_checkpoint
