// The example models (examples/models) under their plans (plans/*.yaml): the
// registry, the plans' parameter bytes and, for the GPT, the bytes one
// training step communicates against a formula written out here by hand;
// and each model sharded at world 2 and 4 against itself unsharded
// (tests/parity.h), float64, three SGD steps.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <vector>

#include "models/convnet.h"
#include "models/gpt.h"
#include "models/lstm_lm.h"
#include "models/model.h"
#include "parity.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"

namespace test_models {

namespace {

namespace ex = shardplan::examples;

shardplan::Plan plan_of(const std::string& model) {
  return shardplan::load_plan(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/" + model + ".yaml");
}

// Small enough to be fast, every dim divisible by 4 ranks.
const ex::Overrides kGpt = {{"vocab", "32"}, {"context", "8"}, {"embed", "16"},
                            {"heads", "4"},  {"layers", "2"},  {"mlp", "24"}};
const ex::Overrides kConvNet = {{"channels", "2"}, {"size", "6"},    {"conv1", "8"},
                                {"conv2", "8"},    {"hidden", "12"}, {"classes", "4"}};
const ex::Overrides kLstm = {{"vocab", "32"}, {"context", "6"}, {"embed", "8"}, {"hidden", "12"}, {"layers", "2"}};

ex::ModelHandle build(const std::string& name, const ex::Overrides& config, uint64_t seed = 3) {
  torch::manual_seed(seed);
  return ex::make_model(name, config);
}

// ------------------------------------------------------------ registry

TEST(Models, RegistryBuildsEveryModelWithItsLossModule) {
  EXPECT_EQ(ex::model_names(), (std::vector<std::string>{"gpt", "convnet", "lstm_lm", "llama", "gpt2"}));
  for (const auto& name : ex::model_names()) {
    auto h = ex::make_model(name);
    ASSERT_NE(h.model, nullptr) << name;
    EXPECT_TRUE(h.module->named_modules().contains("loss")) << name;
    EXPECT_FALSE(h.model->config_str().empty());
    // Cloneable: the in-process wrapper and parity tests clone models.
    auto clone = ex::as_example(h.module->clone());
    EXPECT_EQ(clone.module->named_parameters().keys(), h.module->named_parameters().keys()) << name;
  }
}

TEST(Models, RegistryRejectsUnknownNamesAndKeys) {
  try {
    ex::make_model("gtp");
    FAIL() << "no error";
  } catch (const shardplan::Error& e) {
    EXPECT_STREQ(e.what(), "unknown model 'gtp' (known: gpt, convnet, lstm_lm, llama, gpt2)");
  }
  try {
    ex::make_model("gpt", {{"layer", "3"}});
    FAIL() << "no error";
  } catch (const shardplan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model 'gpt' has no config key 'layer' (known: "), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ex::make_model("gpt", {{"layers", "two"}}), shardplan::Error);
  EXPECT_THROW(ex::make_model("gpt", {{"embed", "10"}, {"heads", "4"}}), shardplan::Error);
  EXPECT_EQ(ex::parse_overrides("layers=4,embed=128"), (ex::Overrides{{"layers", "4"}, {"embed", "128"}}));
  EXPECT_THROW(ex::parse_overrides("layers"), shardplan::Error);
}

TEST(Models, PlansFitEveryModelAtWorldSizes1To4) {
  for (const auto& name : ex::model_names())
    for (int world : {1, 2, 4}) {
      auto h = ex::make_model(name);
      EXPECT_NO_THROW(shardplan::check_plan(*h.module, plan_of(name), world)) << name << " at " << world;
    }
}

// ------------------------------------------------------------ GPT: bytes

struct GptSizes {
  int64_t V, T, E, L, M;
};

GptSizes sizes_of(const ex::Overrides& o) {
  return {std::stoll(o.at("vocab")), std::stoll(o.at("context")), std::stoll(o.at("embed")), std::stoll(o.at("layers")),
          std::stoll(o.at("mlp"))};
}

// One training step of plans/gpt.yaml, per rank, counted as the buffers handed
// to collectives (N = B*T tokens):
int64_t gpt_step_bytes(const GptSizes& s, int64_t batch, int64_t element_size) {
  const int64_t n = batch * s.T;
  int64_t elements = 0;
  elements += n * s.E;        // forward: vocab-parallel token embedding, all-reduce
  elements += s.L * n * s.E;  //          each block's out_proj (row-parallel), all-reduce
  elements += s.L * n * s.E;  //          each block's fc2 (row-parallel), all-reduce
  elements += 3 * n;          //          loss: row max, sum of exp, target logit
  elements += n * s.E;        // backward: LM head input gradient (column-parallel entry)
  elements += s.L * n * s.E;  //           each block's fc1 input gradient
  elements += s.L * n * s.E;  //           each block's attention input gradient
  return elements * element_size;
}

// Parameter bytes of plans/gpt.yaml: what stays whole on every rank, and what
// is split over the model axis.
std::pair<int64_t, int64_t> gpt_param_elements(const GptSizes& s) {
  const int64_t replicated = s.T * s.E                      // pos_emb
                             + s.L * (2 * s.E + 2 * s.E     // ln1, ln2
                                      + s.E + s.E)          // out_proj.bias, fc2.bias
                             + 2 * s.E;                     // ln_f
  const int64_t sharded = s.V * s.E                         // tok_emb
                          + s.L * (3 * s.E * s.E + 3 * s.E  // in_proj weight, bias
                                   + s.E * s.E              // out_proj.weight
                                   + s.M * s.E + s.M        // fc1
                                   + s.E * s.M)             // fc2.weight
                          + s.V * s.E;                      // head (no bias)
  return {replicated, sharded};
}

void check_gpt_step(int world, torch::Dtype dtype) {
  const int64_t batch = 3, esize = dtype == torch::kDouble ? 8 : 4;
  const GptSizes s = sizes_of(kGpt);
  auto ref = std::dynamic_pointer_cast<ex::GPTImpl>(build("gpt", kGpt).module);
  ref->to(dtype);
  torch::manual_seed(11);
  ex::Batch batch_data{torch::randint(s.V, {batch, s.T}, torch::kLong),
                       torch::randint(s.V, {batch, s.T}, torch::kLong)};
  std::vector<std::shared_ptr<ex::GPTImpl>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(std::dynamic_pointer_cast<ex::GPTImpl>(ref->clone()));

  const int64_t expected = gpt_step_bytes(s, batch, esize);
  const auto params = gpt_param_elements(s);
  ASSERT_EQ((params.first + params.second) * esize, [&] {
    int64_t b = 0;
    for (const auto& p : ref->parameters()) b += p.numel() * p.element_size();
    return b;
  }()) << "the hand count misses a parameter";
  // The example prints its own formula; it must agree with the one above.
  EXPECT_EQ(ref->min_comm_bytes(batch, world, esize), world == 1 ? 0 : expected);

  std::mutex mu;
  std::map<int, std::pair<uint64_t, int64_t>> got;  // rank -> (comm bytes, parameter bytes)
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    auto& model = *replicas[w.rank()];
    shardplan::parallelize(model, plan_of("gpt"), w);
    int64_t held = 0;
    for (const auto& p : model.parameters()) held += p.numel() * p.element_size();
    w.reset_stats();
    model.loss(batch_data).backward();
    const uint64_t bytes = w.total_stats().bytes;
    std::lock_guard<std::mutex> lock(mu);
    got[w.rank()] = {bytes, held};
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(got[r].first, static_cast<uint64_t>(world == 1 ? 0 : expected)) << "rank " << r << " of " << world;
    EXPECT_EQ(got[r].second, (params.first + params.second / world) * esize) << "rank " << r << " of " << world;
  }
}

TEST(Models, GptStepCommunicatesExactlyThePlansMinimum) {
  check_gpt_step(2, torch::kFloat);
  check_gpt_step(4, torch::kFloat);
  check_gpt_step(2, torch::kDouble);
  check_gpt_step(1, torch::kFloat);
}

// ------------------------------------------------------------ parity

using parity::Shards;
using parity::local_by;

template <class Impl>
void expect_parity_at(const std::string& name, const ex::Overrides& config, const Shards& shards, int world) {
  auto ref = std::dynamic_pointer_cast<Impl>(build(name, config).module);
  ref->to(torch::kDouble);
  parity::Setup s;
  s.world = world;
  s.steps = 3;
  torch::manual_seed(5);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  for (int i = 0; i < s.steps; ++i) {
    ex::Batch b;
    if (name == "convnet") {
      b = ref->sample(gen, 4, nullptr);
    } else {
      const int64_t v = std::stoll(config.at("vocab")), t = std::stoll(config.at("context"));
      b = {torch::randint(v, {3, t}, torch::kLong), torch::randint(v, {3, t}, torch::kLong)};
    }
    s.inputs.push_back({b.input, b.target});
  }
  s.forward = [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
    return dynamic_cast<Impl&>(m).loss({in[0], in[1]});
  };
  s.local = local_by(shards);
  auto failures = parity::compare(ref, plan_of(name), s);
  EXPECT_TRUE(failures.empty()) << name << " at " << world << ": " << failures.size()
                                << " failures, first: " << (failures.empty() ? "" : failures[0]);
}

template <class Impl>
void expect_parity(const std::string& name, const ex::Overrides& config, const Shards& shards) {
  for (int world : {2, 4}) expect_parity_at<Impl>(name, config, shards, world);
}

TEST(Models, GptShardedMatchesUnsharded) {
  expect_parity<ex::GPTImpl>("gpt", kGpt,
                             {{"tok_emb\\.weight", {0, 1}},
                              {".*attn\\.in_proj_(weight|bias)", {0, 3}},
                              {".*out_proj\\.weight", {1, 1}},
                              {".*fc1\\.(weight|bias)", {0, 1}},
                              {".*fc2\\.weight", {1, 1}},
                              {"head\\.weight", {0, 1}}});
}

TEST(Models, ConvNetShardedMatchesUnsharded) {
  expect_parity<ex::ConvNetImpl>("convnet", kConvNet,
                                 {{"conv1\\.(weight|bias)", {0, 1}},
                                  {"conv2\\.weight", {1, 1}},
                                  {"fc1\\.(weight|bias)", {0, 1}},
                                  {"fc2\\.weight", {1, 1}}});
}

TEST(Models, LstmLmShardedMatchesUnsharded) {
  expect_parity<ex::LSTMLMImpl>(
      "lstm_lm", kLstm,
      {{"embedding\\.weight", {0, 1}}, {"lstm\\.(weight|bias)_.*", {0, 4}}, {"head\\.(weight|bias)", {0, 1}}});
}

}  // namespace

}  // namespace test_models
