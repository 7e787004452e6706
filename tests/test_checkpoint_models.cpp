// Checkpoints of every example model (examples/models) under its plan
// (plans/*.yaml): saved at 2 ranks after some steps, loaded at 1, 2 and 4
// ranks and into the plain model (collected whole state, and the sharded
// checkpoint itself), the next steps' losses equal an uninterrupted run,
// with SGD momentum and with Adam. Covers blocked layouts (MHA q/k/v, LSTM
// gates) and an uneven vocab-parallel embedding.
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/model.h"
#include "shardplan/checkpoint.h"
#include "shardplan/checkpoint_meta.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"
#include "shardplan/zero_optimizer.h"

namespace test_checkpoint_models {

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

std::vector<ex::Batch> batches(const Case& c, const std::shared_ptr<torch::nn::Module>& model, int n,
                               int64_t rows = 3) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(23);
  std::vector<ex::Batch> out;
  for (int i = 0; i < n; ++i) {
    if (c.model == "convnet") {
      ex::Batch b = ex::as_example(model).model->sample(gen, rows, nullptr);
      out.push_back({b.input.to(torch::kDouble), b.target});
    } else {
      const int64_t v = std::stoll(c.config.at("vocab")), t = std::stoll(c.config.at("context"));
      out.push_back(
          {torch::randint(v, {rows, t}, gen, torch::kLong), torch::randint(v, {rows, t}, gen, torch::kLong)});
    }
  }
  return out;
}

std::unique_ptr<torch::optim::Optimizer> optimizer(const std::string& kind, std::vector<torch::Tensor> params) {
  if (kind == "sgd") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
}

std::unique_ptr<torch::optim::Optimizer> optimizer(const std::string& kind, torch::nn::Module& m) {
  return optimizer(kind, m.parameters());
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

// ------------------------------------------------------------ 2-D meshes

// Where one stage of a resharding chain runs.
struct Layout {
  std::string name;
  int world = 1;
  std::string plan;  // "": the plain model, ParallelReport{}
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// plans/gpt_2d.yaml ({data: 2, model: 2}) with small buckets (several per
// model, so ZeRO's slices cut parameters at arbitrary offsets), with or
// without ZeRO-1.
std::string gpt_2d_plan(int zero) {
  std::string text = read_text(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/gpt_2d.yaml");
  const std::string key = "data_parallel: {bucket_mb: 25}";
  const auto at = text.find(key);
  if (at == std::string::npos) throw std::runtime_error("plans/gpt_2d.yaml has no '" + key + "'");
  return text.replace(at, key.size(), std::string("data_parallel: {bucket_mb: 0.004") + (zero ? ", zero: " + std::to_string(zero) + "}" : std::string("}")));
}

// Every tensor of a checkpoint (model and optimizer state) whole, as dtype,
// shape and the CRC-32C of its bytes, plus the optimizer attributes:
// converted offline to one rank, where every tensor is one piece.
std::map<std::string, std::string> fingerprint(const fs::path& dir) {
  const fs::path one = dir.string() + ".one";
  shardplan::reshard_checkpoint(dir.string(), one.string(), 1, "version: 1\nmesh: {model: auto}\nrules: []\n");
  const auto meta = shardplan::ckpt::parse_meta(read_text(one / shardplan::ckpt::kMetaFile), one.string());
  std::map<std::string, std::string> out;
  for (const auto& e : meta.tensors) {
    std::string shape;
    for (auto d : e.shape) shape += std::to_string(d) + ",";
    out[e.name] = e.dtype + "[" + shape + "] crc " + std::to_string(e.pieces.at(0).crc32c);
  }
  for (const auto& [k, v] : meta.attributes)
    if (k.rfind("optimizer", 0) == 0) out["attribute " + k] = v;
  fs::remove_all(one);
  return out;
}

void expect_same_checkpoint(const fs::path& a, const fs::path& b, const std::string& what) {
  const auto fa = fingerprint(a), fb = fingerprint(b);
  EXPECT_EQ(fa.size(), fb.size()) << what;
  for (const auto& [name, value] : fa) {
    auto it = fb.find(name);
    if (it == fb.end()) {
      ADD_FAILURE() << what << ": '" << name << "' missing";
      continue;
    }
    EXPECT_EQ(it->second, value) << what << ": '" << name << "'";
  }
}

// One stage on `l`'s ranks, each from a clone of `init`: loads `load`
// (unless empty) and saves it again at once to `resave` (unless empty: what
// was loaded, written back from this layout), trains batches [from, to) on
// the global batch, saves `save` (unless empty). Returns the global mean
// losses.
std::vector<double> stage(const Case& c, const Layout& l, const std::shared_ptr<torch::nn::Module>& init,
                          const std::vector<ex::Batch>& data, const std::string& kind, const fs::path& load,
                          const fs::path& resave, int from, int to, const fs::path& save) {
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < l.world; ++r) replicas.push_back(init->clone());
  std::vector<double> losses;
  std::mutex mu;
  std::vector<std::string> failures;
  shardplan::run_ranks_in_threads(l.world, [&](shardplan::World& w) {
    try {
      auto& m = *replicas[w.rank()];
      shardplan::ParallelReport report;
      std::unique_ptr<shardplan::DataParallel> dp;
      if (!l.plan.empty()) {
        const auto plan = shardplan::parse_plan(l.plan, l.name + ".yaml");
        report = shardplan::parallelize(m, plan, w);
        dp = std::make_unique<shardplan::DataParallel>(m, report, plan, w);
      }
      std::unique_ptr<torch::optim::Optimizer> opt;
      std::unique_ptr<shardplan::ZeroOptimizer> zero;
      if (dp && dp->zero())
        zero = std::make_unique<shardplan::ZeroOptimizer>(*dp, [&](std::vector<torch::Tensor> p) { return optimizer(kind, p); });
      else
        opt = optimizer(kind, m);
      shardplan::CheckpointOptions o;
      o.optimizer = opt.get();
      o.zero = zero.get();
      if (!load.empty()) shardplan::load_checkpoint(load.string(), m, report, w, o);
      if (!resave.empty()) shardplan::save_checkpoint(resave.string(), m, report, w, o);
      auto& model = dynamic_cast<ex::ExampleModel&>(m);
      std::vector<double> mine;
      for (int s = from; s < to; ++s) {
        zero ? zero->zero_grad() : opt->zero_grad();
        ex::Batch b = data[s];
        if (dp) b = {dp->local_batch(b.input), dp->local_batch(b.target)};
        at::Tensor loss = model.loss(b);
        const double local = loss.item<double>();
        loss.backward();
        if (dp) dp->finish();
        if (zero)
          zero->step();
        else
          opt->step();
        mine.push_back(dp ? dp->average(local) : local);
      }
      if (dp) dp->check_replicas();
      if (!save.empty()) shardplan::save_checkpoint(save.string(), m, report, w, o);
      std::lock_guard<std::mutex> lock(mu);
      if (w.rank() == 0) losses = mine;
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back("rank " + std::to_string(w.rank()) + ": " + e.what());
    }
  });
  EXPECT_TRUE(failures.empty()) << l.name << ": " << failures.front();
  return losses;
}

struct Param2d {
  std::string opt;
  int zero = 0;  // the ZeRO stage
};

// Test names without GetParam()'s bytes.
void PrintTo(const Param2d& p, std::ostream* os) { *os << p.opt << (p.zero ? " zero " + std::to_string(p.zero) : ""); }

class Checkpoint2d : public ::testing::TestWithParam<Param2d> {};

// {data: 2, model: 2} -> {model: 2} -> plain -> {data: 2, model: 2} (and,
// with ZeRO 1, 2 or 3, -> {data: 4} at ZeRO-1): every load written straight back is the same
// checkpoint bit for bit (parameters, optimizer state, steps), every stage
// continues with the uninterrupted run's losses, and the 2-D checkpoint
// holds each tensor once, written by the data-coordinate-0 ranks.
TEST_P(Checkpoint2d, ReshardsBothWaysWithOptimizerState) {
  const Case& c = cases().front();  // gpt
  ASSERT_EQ(c.model, "gpt");
  const std::string kind = GetParam().opt;
  const int zero = GetParam().zero;
  constexpr int kAll = 7;
  const auto ref = build(c, 3);
  const auto data = batches(c, ref, kAll, /*rows=*/4);
  const fs::path base = fs::temp_directory_path() / ("shardplan_ckpt2d_" + kind + (zero ? "_zero" + std::to_string(zero) + "_" : "_") +
                                                     std::to_string(::getpid()));
  fs::remove_all(base);
  fs::create_directories(base);

  std::vector<double> want;
  {
    auto m = ref->clone();
    auto opt = optimizer(kind, *m);
    want = train(*m, *opt, data, 0, kAll);
  }
  auto slice = [&](int from, int to) { return std::vector<double>(want.begin() + from, want.begin() + to); };
  const Layout two_d{"2d", 4, gpt_2d_plan(zero)};
  const Layout model2{"model2", 2, read_text(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/gpt.yaml")};
  const Layout plain{"plain", 1, ""};
  const auto other = build(c, 99);

  // 2 steps at {data: 2, model: 2}.
  expect_losses(stage(c, two_d, ref, data, kind, "", "", 0, 2, base / "a"), slice(0, 2), "2d");
  std::set<std::string> files;
  for (const auto& f : fs::directory_iterator(base / "a")) files.insert(f.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"metadata.yaml", "rank-00000.bin", "rank-00001.bin"}))
      << "only the data-coordinate-0 ranks write";
  const auto meta = shardplan::ckpt::parse_meta(read_text(base / "a" / "metadata.yaml"), "a");
  EXPECT_EQ(meta.mesh, (std::vector<std::pair<std::string, int>>{{"data", 2}, {"model", 2}}));
  for (const auto& p : ref->named_parameters()) {
    const std::string field = kind == "sgd" ? "momentum_buffer" : "exp_avg";
    EXPECT_NE(meta.find("optimizer/" + p.key() + "/" + field), nullptr) << p.key();
  }

  // -> {model: 2}, 1 step; -> plain, 1 step; -> 2-D, the rest.
  expect_losses(stage(c, model2, other, data, kind, base / "a", base / "a_at_model2", 2, 3, base / "b"), slice(2, 3),
                "model2");
  expect_same_checkpoint(base / "a", base / "a_at_model2", "2d -> model2");
  expect_losses(stage(c, plain, other, data, kind, base / "b", base / "b_at_plain", 3, 4, base / "c"), slice(3, 4),
                "plain");
  expect_same_checkpoint(base / "b", base / "b_at_plain", "model2 -> plain");
  expect_losses(stage(c, two_d, other, data, kind, base / "c", base / "c_at_2d", 4, kAll, ""), slice(4, kAll),
                "back at 2d");
  expect_same_checkpoint(base / "c", base / "c_at_2d", "plain -> 2d");
  // 2-D -> {model: 4}.
  const Layout model4{"model4", 4, model2.plan};
  expect_losses(stage(c, model4, other, data, kind, base / "a", base / "a_at_model4", 2, 4, ""), slice(2, 4),
                "2d -> model4");
  expect_same_checkpoint(base / "a", base / "a_at_model4", "2d -> model4");
  // And straight from 2-D into the plain model.
  expect_losses(stage(c, plain, other, data, kind, base / "a", base / "a_at_plain", 2, 4, ""), slice(2, 4),
                "2d -> plain");
  expect_same_checkpoint(base / "a", base / "a_at_plain", "2d -> plain");
  if (zero) {
    // ZeRO-1 at another batch-axis size: {data: 4}, the model replicated
    // (a ZeRO-2 or ZeRO-3 checkpoint loads at stage 1 too: the same format).
    const Layout data4{"data4", 4, "version: 1\nmesh: {data: 4}\ndata_parallel: {bucket_mb: 0.004, zero: 1}\nrules: []\n"};
    expect_losses(stage(c, data4, other, data, kind, base / "a", base / "a_at_data4", 2, kAll, ""), slice(2, kAll),
                  "2d -> data4");
    expect_same_checkpoint(base / "a", base / "a_at_data4", "2d -> data4");
  }
  fs::remove_all(base);
}

INSTANTIATE_TEST_SUITE_P(Meshes, Checkpoint2d,
                         ::testing::Values(Param2d{"adam", 0}, Param2d{"adam", 1}, Param2d{"sgd", 0},
                                           Param2d{"sgd", 1}, Param2d{"adam", 2}, Param2d{"adam", 3},
                                           Param2d{"sgd", 3}),
                         [](const ::testing::TestParamInfo<Param2d>& i) {
                           return i.param.opt + (i.param.zero >= 2 ? "_zero" + std::to_string(i.param.zero)
                                                                   : i.param.zero ? "_zero" : "_replicated");
                         });

// A ZeRO-1 checkpoint with a rank's file gone: one line naming it, nothing
// changed.
TEST(Checkpoint2dBroken, MissingPieceNamesTheFileAndChangesNothing) {
  const Case& c = cases().front();
  const auto ref = build(c, 3);
  const auto data = batches(c, ref, 2, 4);
  const fs::path base = fs::temp_directory_path() / ("shardplan_ckpt2d_broken_" + std::to_string(::getpid()));
  fs::remove_all(base);
  const Layout two_d{"2d", 4, gpt_2d_plan(true)};
  stage(c, two_d, ref, data, "adam", "", "", 0, 1, base / "a");
  // The saved mesh {data: 2, model: 2} fits 4 ranks only: the error says how to name another.
  try {
    shardplan::reshard_checkpoint((base / "a").string(), (base / "three").string(), 3);
    ADD_FAILURE() << "resharded a {data: 2, model: 2} checkpoint for 3 ranks";
  } catch (const shardplan::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("has 4 ranks but the world has 3 ranks (the plan saved with the "
                                               "checkpoint fixes its mesh; give a plan whose mesh fits 3 ranks"));
  }
  fs::remove(base / "a" / "rank-00001.bin");
  const auto other = build(c, 99);
  std::vector<std::string> errors(4);
  std::vector<bool> unchanged(4, false);
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < 4; ++r) replicas.push_back(other->clone());
  shardplan::run_ranks_in_threads(4, [&](shardplan::World& w) {
    auto& m = *replicas[w.rank()];
    const auto plan = shardplan::parse_plan(two_d.plan, "2d.yaml");
    auto report = shardplan::parallelize(m, plan, w);
    shardplan::DataParallel dp(m, report, plan, w);
    shardplan::ZeroOptimizer zero(dp, [](std::vector<torch::Tensor> p) { return optimizer("adam", p); });
    const auto before = shardplan::local_state_dict(m);
    std::vector<torch::Tensor> copies;
    for (const auto& kv : before) copies.push_back(kv.second.clone());
    shardplan::CheckpointOptions o;
    o.zero = &zero;
    try {
      shardplan::load_checkpoint((base / "a").string(), m, report, w, o);
    } catch (const std::exception& e) {
      errors[w.rank()] = e.what();
    }
    bool same = zero.inner().state().empty();
    const auto after = shardplan::local_state_dict(m);
    for (size_t i = 0; i < after.size(); ++i) same = same && after[i].second.equal(copies[i]);
    unchanged[w.rank()] = same;
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(errors[r], ::testing::HasSubstr("rank-00001.bin' is missing")) << "rank " << r;
    EXPECT_EQ(errors[r].find('\n'), std::string::npos) << errors[r];
    EXPECT_TRUE(unchanged[r]) << "rank " << r;
  }
  fs::remove_all(base);
}

// Rank 0's error saving a {data: 2} ZeRO-1 GPT to `name` with the options
// `set` fills in (it may keep an optimizer alive in its last argument); the
// save must leave no directory.
using SetOptions = std::function<void(shardplan::CheckpointOptions&, shardplan::ZeroOptimizer&, torch::nn::Module&,
                                      std::unique_ptr<torch::optim::Optimizer>&)>;
std::string zero_save_error(const std::string& name, const SetOptions& set) {
  const auto ref = build(cases().front(), 3);
  const fs::path dir = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  std::string error;
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
    auto m = ref->clone();
    const auto plan =
        shardplan::parse_plan("version: 1\nmesh: {data: 2}\ndata_parallel: {zero: true}\nrules: []\n", "z.yaml");
    auto report = shardplan::parallelize(*m, plan, w);
    shardplan::DataParallel dp(*m, report, plan, w);
    shardplan::ZeroOptimizer zero(dp, [](std::vector<torch::Tensor> p) { return optimizer("adam", p); });
    std::unique_ptr<torch::optim::Optimizer> keep;
    shardplan::CheckpointOptions o;
    set(o, zero, *m, keep);
    try {
      shardplan::save_checkpoint(dir.string(), *m, report, w, o);
    } catch (const std::exception& e) {
      if (w.rank() == 0) error = e.what();
    }
  });
  EXPECT_FALSE(fs::exists(dir)) << dir;
  return error;
}

TEST(Checkpoint2dBroken, OptimizerAndZeroTogetherIsAnError) {
  const auto error = zero_save_error("shardplan_ckpt2d_both", [](auto& o, auto& zero, auto& m, auto& keep) {
    keep = optimizer("adam", m);
    o.optimizer = keep.get();
    o.zero = &zero;
  });
  EXPECT_THAT(error, ::testing::HasSubstr("set optimizer or zero, not both"));
}

// ZeRO's inner optimizer holds slices, not the model's parameters: given as
// CheckpointOptions::optimizer it would save no state; it is refused.
TEST(Checkpoint2dBroken, ZeroInnerOptimizerAsOptimizerIsAnError) {
  const auto error = zero_save_error("shardplan_ckpt2d_inner",
                                     [](auto& o, auto& zero, auto&, auto&) { o.optimizer = &zero.inner(); });
  EXPECT_THAT(error, ::testing::HasSubstr("is not a parameter of the model"));
}

}  // namespace

}  // namespace test_checkpoint_models
