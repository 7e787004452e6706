// Sequence parallelism (docs/PLAN_FORMAT.md, "Sequence parallelism"): the
// example GPT under plans/gpt_sp.yaml and a batch-first model, sharded over
// model axes of 2, 3 and 4 thread ranks, against themselves unsharded
// (tests/parity.h: outputs, input and parameter gradients, parameters after
// SGD and Adam steps; float64 at 1e-12, float32); the LayerNorm gradients
// that need the all-reduce (and a plan that skips it, which the same check
// catches); uneven sequences; the plan keys and every misuse as a one-line
// error.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <iterator>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "models/model.h"
#include "parity.h"
#include "shardplan/error.h"
#include "shardplan/nn/conv.h"
#include "shardplan/nn/cross_entropy.h"
#include "shardplan/nn/dropout.h"
#include "shardplan/nn/embedding.h"
#include "shardplan/nn/layer_norm.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"

namespace test_sequence_parallel {

namespace {

namespace ex = shardplan::examples;
using parity::Shards;
using parity::local_by;

std::string read_plan_text(const std::string& name) {
  std::ifstream in(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/" + name);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Every dim divisible by 2, 3 and 4 ranks: 12 heads of 2, a context of 12.
const ex::Overrides kGpt = {{"vocab", "36"}, {"context", "12"}, {"embed", "24"},
                            {"heads", "12"}, {"layers", "2"},   {"mlp", "24"}};
const Shards kGptShards = {{"tok_emb\\.weight", {0, 1}},   {".*attn\\.in_proj_(weight|bias)", {0, 3}},
                           {".*out_proj\\.weight", {1, 1}}, {".*fc1\\.(weight|bias)", {0, 1}},
                           {".*fc2\\.weight", {1, 1}},      {"head\\.weight", {0, 1}}};

std::vector<std::string> gpt_failures(const shardplan::Plan& plan, int world, torch::Dtype dtype, bool adam,
                                      int64_t context = 12) {
  ex::Overrides config = kGpt;
  config["context"] = std::to_string(context);
  torch::manual_seed(3);
  auto ref = std::dynamic_pointer_cast<ex::GPTImpl>(ex::make_model("gpt", config).module);
  ref->to(dtype);
  parity::Setup s;
  s.world = world;
  s.dtype = dtype;
  s.steps = 3;
  s.adam = adam;
  torch::manual_seed(5);
  for (int i = 0; i < s.steps; ++i)
    s.inputs.push_back({torch::randint(36, {3, context}, torch::kLong), torch::randint(36, {3, context}, torch::kLong)});
  s.forward = [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
    return dynamic_cast<ex::GPTImpl&>(m).loss({in[0], in[1]});
  };
  s.local = local_by(kGptShards);
  return parity::compare(ref, plan, s);
}

std::string first(const std::vector<std::string>& f) { return f.empty() ? "" : f[0]; }

TEST(SequenceParallel, GptMatchesUnshardedAtModelAxis2To4) {
  const auto plan = shardplan::load_plan(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/gpt_sp.yaml");
  for (int world : {2, 3, 4})
    // SGD: Adam divides by the root of the squared gradient, and the key
    // bias's gradient is zero up to rounding (softmax ignores a shift of
    // every score), so Adam steps it by rounding noise, sharded or not. The
    // batch-first model below trains with Adam.
    for (bool adam : {false}) {
      auto f = gpt_failures(plan, world, torch::kDouble, adam);
      EXPECT_TRUE(f.empty()) << "world " << world << (adam ? " adam" : " sgd") << ": " << f.size()
                             << " failures, first: " << first(f);
    }
}

TEST(SequenceParallel, GptFloat32MatchesUnsharded) {
  const auto plan = shardplan::load_plan(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/gpt_sp.yaml");
  auto f = gpt_failures(plan, 2, torch::kFloat, false);
  EXPECT_TRUE(f.empty()) << f.size() << " failures, first: " << first(f);
}

// The classic silent bug: LayerNorms on a part of the sequence whose weight
// gradients are not all-reduced. A plan that says they see whole
// activations (sequence_parallel: false) gets exactly that bug, and the
// parity check finds it in the LayerNorm gradients.
TEST(SequenceParallel, LayerNormGradientsWithoutTheAllReduceAreCaught) {
  std::string text = read_plan_text("gpt_sp.yaml");
  const std::string ln_rule = "  - match: '(blocks\\.\\d+\\.ln[12]|ln_f)\\.(weight|bias)'\n    layout: [null]\n";
  const size_t at = text.find(ln_rule);
  ASSERT_NE(at, std::string::npos);
  text.insert(at + ln_rule.size(), "    sequence_parallel: false\n");
  auto f = gpt_failures(shardplan::parse_plan(text, "no_ln_reduce.yaml"), 2, torch::kDouble, false);
  ASSERT_FALSE(f.empty());
  bool ln_grad = false;
  for (const auto& m : f) ln_grad |= m.find("grad blocks.0.ln1.weight") != std::string::npos;
  EXPECT_TRUE(ln_grad) << first(f);
}

TEST(SequenceParallel, UnevenSequenceIsAClearError) {
  const auto plan = shardplan::load_plan(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/gpt_sp.yaml");
  try {
    gpt_failures(plan, 2, torch::kDouble, false, 7);
    FAIL() << "no error";
  } catch (const shardplan::Error& e) {
    // The token or the position embedding, whichever runs first.
    EXPECT_NE(std::string(e.what()).find(", length 7) is not divisible by the 2 ranks of group 'model'; uneven "
                                         "sequences are not supported"),
              std::string::npos)
        << e.what();
  }
}

// ------------------------------------------------------------ batch first

// Activations [B, T, E]: the sequence is dim 1; the position embedding's
// ids are [T], so its output's sequence is dim 0 (`sequence_dim: 0`).
struct BatchFirstImpl : torch::nn::Cloneable<BatchFirstImpl> {
  BatchFirstImpl() { reset(); }
  void reset() override {
    tok = register_module("tok", shardplan::nn::Embedding(12, 8));
    pos = register_module("pos", shardplan::nn::Embedding(12, 8));
    ln = register_module("ln", shardplan::nn::LayerNorm(std::vector<int64_t>{8}));
    fc1 = register_module("fc1", shardplan::nn::Linear(8, 12));
    fc2 = register_module("fc2", shardplan::nn::Linear(12, 8));
    ln_f = register_module("ln_f", shardplan::nn::LayerNorm(std::vector<int64_t>{8}));
    head = register_module("head", shardplan::nn::Linear(torch::nn::LinearOptions(8, 12).bias(false)));
    loss = register_module("loss", shardplan::nn::CrossEntropyLoss());
  }
  torch::Tensor forward(const torch::Tensor& tokens, const torch::Tensor& target) {
    auto x = tok->forward(tokens) + pos->forward(torch::arange(tokens.size(1)));
    x = x + fc2->forward(torch::gelu(fc1->forward(ln->forward(x))));
    auto logits = head->forward(ln_f->forward(x));
    return loss->forward(logits.reshape({-1, logits.size(-1)}), target.reshape(-1));
  }
  shardplan::nn::Embedding tok{nullptr}, pos{nullptr};
  shardplan::nn::LayerNorm ln{nullptr}, ln_f{nullptr};
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
  shardplan::nn::CrossEntropyLoss loss{nullptr};
};
TORCH_MODULE(BatchFirst);

const char* kBatchFirstPlan = R"(version: 1
mesh: {model: auto}
sequence_parallel: {dim: 1}
rules:
  - match: 'tok\.weight'
    layout: [model, null]
  - match: 'pos\.weight'
    layout: [null, null]
    sequence_dim: 0
  - match: '(ln|ln_f)\.(weight|bias)'
    layout: [null]
  - match: 'fc1\.weight'
    layout: [model, null]
    output: sharded
  - match: 'fc1\.bias'
    layout: [model]
  - match: 'fc2\.weight'
    layout: [null, model]
    input: sharded
  - match: 'fc2\.bias'
    layout: [null]
  - match: 'head\.weight'
    layout: [model, null]
    output: sharded
  - match: 'loss'
    layout: [null, model]
)";

TEST(SequenceParallel, BatchFirstModelMatchesUnsharded) {
  const auto plan = shardplan::parse_plan(kBatchFirstPlan, "batch_first.yaml");
  for (int world : {2, 3, 4}) {
    torch::manual_seed(7);
    auto ref = BatchFirst().ptr();
    ref->to(torch::kDouble);
    parity::Setup s;
    s.world = world;
    s.steps = 3;
    s.adam = world != 3;
    torch::manual_seed(8);
    for (int i = 0; i < s.steps; ++i)
      s.inputs.push_back({torch::randint(12, {2, 12}, torch::kLong), torch::randint(12, {2, 12}, torch::kLong)});
    s.forward = [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
      return dynamic_cast<BatchFirstImpl&>(m).forward(in[0], in[1]);
    };
    s.local = local_by({{"tok\\.weight", {0, 1}},
                        {"fc1\\.(weight|bias)", {0, 1}},
                        {"fc2\\.weight", {1, 1}},
                        {"head\\.weight", {0, 1}}});
    auto f = parity::compare(ref, plan, s);
    EXPECT_TRUE(f.empty()) << "world " << world << ": " << f.size() << " failures, first: " << first(f);
  }
}

// ------------------------------------------------------------ plan keys

void expect_plan_error(const std::string& yaml, const std::string& message) {
  try {
    shardplan::parse_plan(yaml, "sp.yaml");
    FAIL() << "no error for:\n" << yaml;
  } catch (const shardplan::PlanError& e) {
    EXPECT_EQ(std::string(e.what()).substr(0, message.size()), message) << e.what();
  }
}

TEST(SequenceParallel, PlanKeysParseAndRoundTrip) {
  auto plan = shardplan::parse_plan(kBatchFirstPlan, "batch_first.yaml");
  EXPECT_TRUE(plan.sequence_parallel.enabled);
  EXPECT_EQ(plan.sequence_parallel.dim, 1);
  EXPECT_EQ(plan.sequence_axis(), "model");
  auto again = shardplan::parse_plan(plan.to_yaml());
  EXPECT_EQ(again.to_yaml(), plan.to_yaml());
  EXPECT_NE(plan.to_yaml().find("sequence_parallel: {dim: 1}\n"), std::string::npos) << plan.to_yaml();
  EXPECT_NE(plan.to_yaml().find("    sequence_dim: 0\n"), std::string::npos);
  // With a batch axis, the other axis; named when there are several.
  EXPECT_EQ(shardplan::parse_plan("mesh: {data: 2, model: 2}\nsequence_parallel: {dim: 0}\nrules: []\n")
                .sequence_axis(),
            "model");
  EXPECT_EQ(shardplan::parse_plan("mesh: {a: 2, b: 2}\nsequence_parallel: {dim: -2, axis: b}\nrules: []\n")
                .sequence_axis(),
            "b");
  EXPECT_EQ(shardplan::parse_plan("mesh: {model: 2}\nrules: []\n").sequence_axis(), "");
}

TEST(SequenceParallel, BadPlanKeysAreErrorsAtTheirLine) {
  expect_plan_error("mesh: {model: 2}\nsequence_parallel: true\nrules: []\n",
                    "sp.yaml:2:20: sequence_parallel must be a map with the sequence dim");
  expect_plan_error("mesh: {model: 2}\nsequence_parallel: {axis: model}\nrules: []\n",
                    "sp.yaml:2:20: sequence_parallel must be a map with the sequence dim");
  expect_plan_error("mesh: {model: 2}\nsequence_parallel: {dim: first}\nrules: []\n",
                    "sp.yaml:2:26: sequence_parallel.dim must be an integer");
  expect_plan_error("mesh: {model: 2}\nsequence_parallel: {dim: 0, dims: 1}\nrules: []\n",
                    "sp.yaml:2:29: unknown key 'dims' in sequence_parallel (expected dim, axis)");
  expect_plan_error("mesh: {model: 2}\nsequence_parallel: {dim: 0, axis: modle}\nrules: []\n",
                    "sp.yaml:2:35: sequence_parallel.axis 'modle' is not a mesh axis; mesh axes are: model");
  expect_plan_error("mesh: {a: 2, b: 2}\nsequence_parallel: {dim: 0}\nrules: []\n",
                    "sp.yaml:2:20: sequence_parallel: the mesh has several axes besides the batch axis (a, b)");
  expect_plan_error("mesh: {data: 2}\nsequence_parallel: {dim: 0}\nrules: []\n",
                    "sp.yaml:2:20: sequence_parallel: the mesh has no axis besides the batch axis 'data'");
  expect_plan_error("mesh: {model: 2}\nrules:\n  - match: 'a'\n    layout: [null]\n    sequence_dim: 1\n",
                    "sp.yaml:5:19: option 'sequence_dim' needs the plan's top-level sequence_parallel map");
  expect_plan_error(
      "mesh: {model: 2}\nsequence_parallel: {dim: 0}\nrules:\n  - match: 'a'\n    layout: [null]\n"
      "    sequence_parallel: maybe\n",
      "sp.yaml:6:24: sequence_parallel must be true or false, got 'maybe'");
  expect_plan_error(
      "mesh: {model: 2}\nsequence_parallel: {dim: 0}\nrules:\n  - match: 'a'\n    layout: [null]\n"
      "    sequence_dim: x\n",
      "sp.yaml:6:19: sequence_dim must be an integer (negative counts from the end), got 'x'");
}

// ------------------------------------------------------------ misuse

std::string check_error(torch::nn::Module& model, const std::string& yaml, int world = 2) {
  try {
    shardplan::check_plan(model, shardplan::parse_plan(yaml, "sp.yaml"), world);
  } catch (const shardplan::Error& e) {
    return e.what();
  }
  return "no error";
}

void expect_has(const std::string& got, const std::string& want) {
  EXPECT_NE(got.find(want), std::string::npos) << "got: " << got;
}

std::string with_rule(const std::string& from, const std::string& to) {
  std::string text = kBatchFirstPlan;
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(SequenceParallel, MisuseIsAOneLineErrorNamingTheLayer) {
  auto model = BatchFirst();
  EXPECT_EQ(check_error(*model, kBatchFirstPlan), "no error");
  // A layer with parameters and no rule: where it runs is not guessed.
  expect_has(check_error(*model, with_rule("'(ln|ln_f)\\.(weight|bias)'", "'ln\\.(weight|bias)'")),
             "sp.yaml:3:20: under sequence_parallel every layer with parameters needs a rule, and module 'ln_f' "
             "(shardplan::nn::LayerNormImpl, parameter 'ln_f.weight') has none");
  expect_has(check_error(*model, with_rule("    layout: [model, null]\n    output: sharded\n  - match: 'fc1\\.bias'",
                                           "    layout: [model, null]\n  - match: 'fc1\\.bias'")),
             "parameter 'fc1.weight': a column-parallel Linear in the sequence-parallel region gathers");
  expect_has(check_error(*model, with_rule("    layout: [null, model]\n    input: sharded\n", "    layout: [null, model]\n")),
             "parameter 'fc2.weight': a row-parallel Linear in the sequence-parallel region needs its input");
  expect_has(check_error(*model, with_rule("'(ln|ln_f)\\.(weight|bias)'\n    layout: [null]",
                                           "'(ln|ln_f)\\.(weight|bias)'\n    layout: [model]")),
             "parameter 'ln.weight': a LayerNorm cannot be split");
  // Rules of one layer must agree on it.
  expect_has(check_error(*model, with_rule("'fc1\\.bias'\n    layout: [model]\n",
                                           "'fc1\\.bias'\n    layout: [model]\n    sequence_parallel: false\n")),
             "module 'fc1': sequence_parallel is false here but true at the rule at sp.yaml:");
  // A replicated embedding whose output is split needs the sequence dim to exist.
  const std::string pos_dim_2 = with_rule("    sequence_dim: 0\n", "    sequence_dim: 2\n");
  try {
    torch::manual_seed(1);
    auto m = BatchFirst();
    m->to(torch::kDouble);
    shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
      auto mine = std::dynamic_pointer_cast<BatchFirstImpl>(m->clone());
      shardplan::parallelize(*mine, shardplan::parse_plan(pos_dim_2, "sp.yaml"), w);
      mine->forward(torch::zeros({2, 4}, torch::kLong), torch::zeros({2, 4}, torch::kLong));
    });
    ADD_FAILURE() << "no error";
  } catch (const shardplan::Error& e) {
    expect_has(e.what(), "sequence parallel: sequence dim 2 does not exist in an activation of 2 dims [4, 8]");
  }
}

struct VanillaNormImpl : torch::nn::Cloneable<VanillaNormImpl> {
  VanillaNormImpl() { reset(); }
  void reset() override {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
    conv = register_module("conv", shardplan::nn::Conv1d(torch::nn::Conv1dOptions(8, 8, 3)));
  }
  torch::nn::LayerNorm ln{nullptr};
  shardplan::nn::Conv1d conv{nullptr};
};
TORCH_MODULE(VanillaNorm);

TEST(SequenceParallel, LayersThatCannotRunOnSequencePartsAreRefused) {
  auto model = VanillaNorm();
  const std::string head = "mesh: {model: auto}\nsequence_parallel: {dim: 0}\nrules:\n";
  const std::string conv_off = "  - match: 'conv\\.weight'\n    layout: [null, null, null]\n    sequence_parallel: false\n"
                               "  - match: 'conv\\.bias'\n    layout: [null]\n    sequence_parallel: false\n";
  const std::string ln_rule = "  - match: 'ln\\..*'\n    layout: [null]\n";
  expect_has(check_error(*model, head + ln_rule + conv_off),
             "belongs to a torch::nn::LayerNormImpl, which cannot be sharded: build the model with "
             "shardplan::nn::LayerNorm");
  // Outside the region a vanilla layer confirmed replicated is fine.
  EXPECT_EQ(check_error(*model, head + ln_rule + "    sequence_parallel: false\n" + conv_off), "no error");
  expect_has(check_error(*model, head + ln_rule + "    sequence_parallel: false\n" +
                                     "  - match: 'conv\\.weight'\n    layout: [null, null, null]\n"),
             "module 'conv' (shardplan::nn::Conv1dImpl) is in the sequence-parallel region, but layer plugin 'conv' "
             "does not support sequence parallelism");
}

TEST(SequenceParallel, ReportSaysWhatEachLayerDoes) {
  auto model = BatchFirst();
  auto report = shardplan::check_plan(*model, shardplan::parse_plan(kBatchFirstPlan, "sp.yaml"), 2);
  std::map<std::string, std::string> notes;
  for (const auto& row : report.rows) notes[row.path] = row.note;
  EXPECT_EQ(notes["ln.weight"], "replicated, sequence-parallel (dim 1), gradient all-reduced over 'model'");
  EXPECT_EQ(notes["pos.weight"], "replicated, sequence-parallel (dim 0)");
  EXPECT_EQ(notes["fc2.bias"], "replicated, added per sequence part, gradient all-reduced");
  EXPECT_NE(notes["tok.weight"].find("output reduce-scattered, sequence-parallel (dim 1)"), std::string::npos)
      << notes["tok.weight"];
}

// ------------------------------------------------------------ the LayerNorm twin

// shardplan::nn::LayerNorm is torch::nn::LayerNorm with a seam: same
// parameters and values, bit-identical forward and gradients, and a state
// dict that moves between the two both ways (the example GPT switched to it).
TEST(SequenceParallel, LayerNormTwinIsTorchsLayerNorm) {
  torch::nn::LayerNorm vanilla(torch::nn::LayerNormOptions({6}).eps(1e-4));
  shardplan::nn::LayerNorm ours(torch::nn::LayerNormOptions({6}).eps(1e-4));
  EXPECT_EQ(ours->named_parameters().keys(), vanilla->named_parameters().keys());
  {
    torch::NoGradGuard no_grad;
    vanilla->weight.uniform_(0.5, 1.5);
    vanilla->bias.uniform_(-1, 1);
  }
  // Through a state dict (what a checkpoint holds), both ways.
  auto copy = [](torch::nn::Module& from, torch::nn::Module& to) {
    torch::NoGradGuard no_grad;
    auto dst = to.named_parameters();
    for (const auto& p : from.named_parameters()) dst[p.key()].copy_(p.value());
  };
  copy(*vanilla, *ours);
  auto x = torch::randn({4, 6}, torch::requires_grad());
  auto x2 = x.detach().clone().requires_grad_(true);
  auto a = vanilla->forward(x), b = ours->forward(x2);
  EXPECT_TRUE(torch::equal(a, b));
  a.sum().backward();
  b.sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), x2.grad()));
  EXPECT_TRUE(torch::equal(vanilla->weight.grad(), ours->weight.grad()));
  torch::nn::LayerNorm back(torch::nn::LayerNormOptions({6}).eps(1e-4));
  copy(*ours, *back);
  EXPECT_TRUE(torch::equal(back->forward(x), a));
  std::ostringstream os;
  ours->pretty_print(os);
  EXPECT_EQ(os.str(), "shardplan::nn::LayerNorm([6], eps=0.0001, elementwise_affine=true)");
}

// ------------------------------------------------------------ dropout

// A replicated table whose output is split along the sequence, then dropout.
struct DropImpl : torch::nn::Cloneable<DropImpl> {
  DropImpl() { reset(); }
  void reset() override {
    emb = register_module("emb", shardplan::nn::Embedding(8, 16));
    drop = register_module("drop", shardplan::nn::Dropout(0.5));
  }
  torch::Tensor forward(const torch::Tensor& ids) { return drop->forward(emb->forward(ids)); }
  shardplan::nn::Embedding emb{nullptr};
  shardplan::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Drop);

// Each rank's dropout mask over its part of the sequence.
std::vector<torch::Tensor> masks(const std::string& mesh, int world) {
  const std::string yaml = "mesh: " + mesh + "\nsequence_parallel: {dim: 0}\nrules:\n"
                           "  - match: 'emb\\.weight'\n    layout: [null, null]\n"
                           "  - match: 'drop'\n    layout: [null, null]\n";
  torch::manual_seed(2);
  auto model = Drop();
  std::vector<torch::Tensor> out(world);
  std::mutex mu;
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    auto mine = std::dynamic_pointer_cast<DropImpl>(model->clone());
    shardplan::parallelize(*mine, shardplan::parse_plan(yaml, "drop.yaml"), w);
    auto y = mine->forward(torch::arange(8));
    std::lock_guard<std::mutex> lock(mu);
    out[w.rank()] = y.ne(0);
  });
  return out;
}

TEST(SequenceParallel, DropoutInTheRegionDrawsOneMaskPerPart) {
  auto m = masks("{model: 2}", 2);
  ASSERT_EQ(m[0].sizes(), (std::vector<int64_t>{4, 16}));
  EXPECT_FALSE(m[0].equal(m[1])) << "both parts of the sequence got the same mask";
  // The same part on two data replicas: the same mask (model coord 0: ranks 0, 2).
  auto m2 = masks("{data: 2, model: 2}", 4);
  EXPECT_TRUE(m2[0].equal(m2[2]));
  EXPECT_TRUE(m2[1].equal(m2[3]));
  EXPECT_FALSE(m2[0].equal(m2[1]));
  // Without a rule, whether the masks should differ is not guessed.
  auto model = Drop();
  expect_has(check_error(*model, "mesh: {model: 2}\nsequence_parallel: {dim: 0}\nrules:\n"
                                 "  - match: 'emb\\.weight'\n    layout: [null, null]\n"),
             "sp.yaml:2:20: under sequence_parallel module 'drop' (shardplan::nn::DropoutImpl) needs a rule over its "
             "path");
}

}  // namespace

}  // namespace test_sequence_parallel
