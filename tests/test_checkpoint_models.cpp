// Checkpoints of every example model (examples/models) under its plan
// (plans/*.yaml): saved at 2 ranks after some steps, loaded at 1, 2 and 4
// ranks and into the plain model (collected whole state, and the sharded
// checkpoint itself), the next steps' losses equal an uninterrupted run,
// with SGD momentum and with Adam. Covers blocked layouts (MHA q/k/v, LSTM
// gates) and an uneven vocab-parallel embedding.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "models/model.h"
#include "shardplan/checkpoint.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

namespace {

namespace ex = shardplan::examples;
namespace fs = std::filesystem;

struct Case {
  std::string name;   // test name
  std::string model;  // make_model name
  ex::Overrides config;
  std::string plan;  // plan text; "" = plans/<model>.yaml
};

// The LSTM LM with vocabulary 31 and only its embedding split: 16 + 15 rows
// at 2 ranks, 8 + 8 + 8 + 7 at 4 (the dense head needs an even split).
const char* kUnevenPlan = R"(mesh: {model: auto}
rules:
  - {match: 'embedding\.weight', layout: [model, null]}
  - {match: 'lstm\.weight_(ih|hh)_l\d+', layout: [model, null]}
  - {match: 'lstm\.bias_(ih|hh)_l\d+', layout: [model]}
)";

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"gpt",
       "gpt",
       {{"vocab", "32"}, {"context", "8"}, {"embed", "16"}, {"heads", "4"}, {"layers", "2"}, {"mlp", "24"}},
       ""},
      {"convnet",
       "convnet",
       {{"channels", "2"}, {"size", "6"}, {"conv1", "8"}, {"conv2", "8"}, {"hidden", "12"}, {"classes", "4"}},
       ""},
      {"lstm_lm",
       "lstm_lm",
       {{"vocab", "32"}, {"context", "6"}, {"embed", "8"}, {"hidden", "12"}, {"layers", "2"}},
       ""},
      {"lstm_lm_uneven_vocab",
       "lstm_lm",
       {{"vocab", "31"}, {"context", "6"}, {"embed", "8"}, {"hidden", "12"}, {"layers", "1"}},
       kUnevenPlan},
  };
  return all;
}

shardplan::Plan plan_of(const Case& c) {
  if (!c.plan.empty()) return shardplan::parse_plan(c.plan, c.name + ".yaml");
  return shardplan::load_plan(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/" + c.model + ".yaml");
}

std::shared_ptr<torch::nn::Module> build(const Case& c, uint64_t seed) {
  torch::manual_seed(seed);
  auto m = ex::make_model(c.model, c.config).module;
  m->to(torch::kDouble);
  return m;
}

std::vector<ex::Batch> batches(const Case& c, const std::shared_ptr<torch::nn::Module>& model, int n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(23);
  std::vector<ex::Batch> out;
  for (int i = 0; i < n; ++i) {
    if (c.model == "convnet") {
      ex::Batch b = ex::as_example(model).model->sample(gen, 3, nullptr);
      out.push_back({b.input.to(torch::kDouble), b.target});
    } else {
      const int64_t v = std::stoll(c.config.at("vocab")), t = std::stoll(c.config.at("context"));
      out.push_back({torch::randint(v, {3, t}, gen, torch::kLong), torch::randint(v, {3, t}, gen, torch::kLong)});
    }
  }
  return out;
}

std::unique_ptr<torch::optim::Optimizer> optimizer(const std::string& kind, torch::nn::Module& m) {
  if (kind == "sgd")
    return std::make_unique<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  return std::make_unique<torch::optim::Adam>(m.parameters(), torch::optim::AdamOptions(1e-2));
}

// Losses of batches [from, to), stepping after each.
std::vector<double> train(torch::nn::Module& m, torch::optim::Optimizer& opt, const std::vector<ex::Batch>& data,
                          int from, int to) {
  auto* model = dynamic_cast<ex::ExampleModel*>(&m);
  std::vector<double> out;
  for (int s = from; s < to; ++s) {
    opt.zero_grad();
    at::Tensor loss = model->loss(data[s]);
    out.push_back(loss.item<double>());
    loss.backward();
    opt.step();
  }
  return out;
}

// Runs body(world, model, report) on `world` ranks as threads, each with a
// clone of `ref` parallelized by the plan; collects failures.
template <class F>
std::vector<std::string> on_ranks(int world, const Case& c, const std::shared_ptr<torch::nn::Module>& ref, F body) {
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(ref->clone());
  std::mutex mu;
  std::vector<std::string> failures;
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    try {
      auto& m = *replicas[w.rank()];
      auto report = shardplan::parallelize(m, plan_of(c), w);
      body(w, m, report);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back("rank " + std::to_string(w.rank()) + ": " + e.what());
    }
  });
  return failures;
}

void expect_losses(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-11 * std::abs(want[i])) << what << ", step " << i;
}

struct Param {
  Case c;
  std::string opt;
};

class ModelCheckpoint : public ::testing::TestWithParam<Param> {};

TEST_P(ModelCheckpoint, SavedAt2ResumesAt124AndPlain) {
  const Case& c = GetParam().c;
  const std::string kind = GetParam().opt;
  constexpr int kBefore = 3, kAll = 6;
  const auto ref = build(c, 3);
  const auto data = batches(c, ref, kAll);
  const fs::path dir =
      fs::temp_directory_path() / ("shardplan_ckpt_models_" + c.name + "_" + kind + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);

  // Uninterrupted, unsharded.
  std::vector<double> want;
  {
    auto m = ref->clone();
    auto opt = optimizer(kind, *m);
    want = train(*m, *opt, data, 0, kAll);
  }
  const std::vector<double> after(want.begin() + kBefore, want.end());

  // kBefore steps at 2 ranks, then a sharded checkpoint and the whole state.
  shardplan::StateDict full;
  auto f = on_ranks(2, c, ref, [&](shardplan::World& w, torch::nn::Module& m, const shardplan::ParallelReport& report) {
    auto opt = optimizer(kind, m);
    train(m, *opt, data, 0, kBefore);
    shardplan::CheckpointOptions o;
    o.optimizer = opt.get();
    shardplan::save_checkpoint(dir.string(), m, report, w, o);
    auto all = shardplan::collect_state_dict(m, report, w, 0);
    if (w.rank() == 0) full = all;
  });
  ASSERT_TRUE(f.empty()) << f.front();

  // Sharded at 1, 2, 4 ranks, from a differently initialised model.
  const auto other = build(c, 99);
  for (int world : {1, 2, 4}) {
    std::vector<std::vector<double>> got(world);
    auto g = on_ranks(world, c, other,
                      [&](shardplan::World& w, torch::nn::Module& m, const shardplan::ParallelReport& report) {
                        auto opt = optimizer(kind, m);
                        shardplan::CheckpointOptions o;
                        o.optimizer = opt.get();
                        shardplan::load_checkpoint(dir.string(), m, report, w, o);
                        got[w.rank()] = train(m, *opt, data, kBefore, kAll);
                      });
    ASSERT_TRUE(g.empty()) << "loading at " << world << ": " << g.front();
    for (int r = 0; r < world; ++r)
      expect_losses(got[r], after, "at " + std::to_string(world) + ", rank " + std::to_string(r));
  }

  // Plain model, whole state dict: the parameters match, so does the next loss.
  {
    auto m = other->clone();
    shardplan::load_state_dict(*m, full);
    for (const auto& kv : full) {
      auto* p = m->named_parameters().find(kv.first);
      ASSERT_TRUE(p || m->named_buffers().find(kv.first)) << kv.first;
    }
    auto opt = optimizer(kind, *m);
    expect_losses(train(*m, *opt, data, kBefore, kBefore + 1), {after[0]}, "plain, collected");
  }

  // Plain model, sharded checkpoint with its optimizer state: a default
  // ParallelReport describes an unsharded model.
  {
    auto m = other->clone();
    auto opt = optimizer(kind, *m);
    std::vector<std::string> errors;
    shardplan::run_ranks_in_threads(1, [&](shardplan::World& w) {
      try {
        shardplan::CheckpointOptions o;
        o.optimizer = opt.get();
        shardplan::load_checkpoint(dir.string(), *m, shardplan::ParallelReport{}, w, o);
      } catch (const std::exception& e) {
        errors.push_back(e.what());
      }
    });
    ASSERT_TRUE(errors.empty()) << errors.front();
    expect_losses(train(*m, *opt, data, kBefore, kAll), after, "plain, checkpoint");
  }
  fs::remove_all(dir);
}

// `shardplan ckpt convert --full` writes what torch::load reads into the
// plain model: every tensor equal to the gathered whole state.
TEST(ModelCheckpointTool, FullFileLoadsIntoThePlainModel) {
  const std::string tool = std::string(SHARDPLAN_BINARY_DIR) + "/bin/shardplan-ckpt";
  ASSERT_TRUE(fs::exists(tool)) << tool << " is not built";
  for (const auto& c : cases()) {
    const fs::path dir =
        fs::temp_directory_path() / ("shardplan_ckpt_full_" + c.name + "_" + std::to_string(::getpid()));
    const std::string file = dir.string() + ".pt";
    fs::remove_all(dir);
    const auto ref = build(c, 3);
    shardplan::StateDict full;
    auto f =
        on_ranks(2, c, ref, [&](shardplan::World& w, torch::nn::Module& m, const shardplan::ParallelReport& report) {
          {
            torch::NoGradGuard no_grad;
            for (auto& p : m.parameters()) p.mul_(-2.0);  // nothing a fresh model has
          }
          shardplan::save_checkpoint(dir.string(), m, report, w);
          auto all = shardplan::collect_state_dict(m, report, w, 0);
          if (w.rank() == 0) full = all;
        });
    ASSERT_TRUE(f.empty()) << f.front();
    const std::string cmd = tool + " convert " + dir.string() + " --full --out " + file + " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto plain = build(c, 99);
    torch::load(plain, file);
    ASSERT_EQ(plain->named_parameters().size() + plain->named_buffers().size(), full.size()) << c.name;
    // Kept: find() points into the dict, which must outlive the loop.
    const auto params = plain->named_parameters();
    for (const auto& kv : full) {
      const auto* p = params.find(kv.first);
      ASSERT_NE(p, nullptr) << c.name << ": " << kv.first;
      EXPECT_TRUE(p->equal(kv.second)) << c.name << ": " << kv.first;
      EXPECT_TRUE(p->requires_grad()) << c.name << ": " << kv.first;
    }
    fs::remove_all(dir);
    fs::remove(file);
  }
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (const auto& c : cases())
    for (const char* o : {"sgd", "adam"}) out.push_back({c, o});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, ModelCheckpoint, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& i) { return i.param.c.name + "_" + i.param.opt; });

}  // namespace
