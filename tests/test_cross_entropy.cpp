// Vocab-parallel cross-entropy against torch::nn::CrossEntropyLoss on the
// full logits: a column-parallel head with `output: sharded` feeding
// shardplan::nn::CrossEntropyLoss whose plan rule (over the loss MODULE's
// path) says its input is split along the class dim. Loss, input and
// parameter gradients and parameters after five steps at world sizes 1, 2
// and 4, float64 and float32, across reductions, ignore_index,
// label_smoothing and class weights; the functional on its own; the
// no-full-vocab guarantee; plan-time errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>

#include "parity.h"
#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/nn/cross_entropy.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"

namespace test_cross_entropy {

namespace {

using shardplan::nn::CrossEntropyLoss;
using shardplan::nn::Linear;

constexpr int64_t kIn = 6, kHidden = 5, kVocab = 8, kRows = 12;

struct LMImpl : torch::nn::Cloneable<LMImpl> {
  explicit LMImpl(torch::nn::CrossEntropyLossOptions o) : opts(std::move(o)) { reset(); }
  void reset() override {
    fc1 = register_module("fc1", Linear(kIn, kHidden));
    head = register_module("head", Linear(kHidden, kVocab));
    loss = register_module("loss", CrossEntropyLoss(opts));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& target) {
    return loss->forward(head->forward(torch::tanh(fc1->forward(x))), target);
  }
  torch::nn::CrossEntropyLossOptions opts;
  Linear fc1{nullptr}, head{nullptr};
  CrossEntropyLoss loss{nullptr};
};

const char* kRules =
    "  - {match: 'head\\.weight', layout: [model, null], output: sharded}\n"
    "  - {match: 'loss', layout: [null, model]}\n";

shardplan::Plan lm_plan() { return shardplan::parse_plan(std::string("mesh: {model: auto}\nrules:\n") + kRules, "ce.yaml"); }

struct Variant {
  std::string name;
  std::string reduction;  // mean | sum | none
  int64_t ignore_index = -100;
  bool some_ignored = false;
  double smoothing = 0;
  bool weighted = false;
};

std::vector<Variant> variants() {
  return {
      {"mean", "mean"},
      {"sum", "sum"},
      {"none", "none"},
      {"mean_ignore", "mean", -100, true},
      {"sum_ignore", "sum", -100, true},
      {"none_ignore", "none", -100, true},
      {"mean_ignore_valid_class", "mean", 3, false},  // ignore_index inside [0, C)
      {"mean_smooth", "mean", -100, false, 0.1},
      {"sum_smooth", "sum", -100, false, 0.2},
      {"none_smooth", "none", -100, false, 0.1},
      {"mean_ignore_smooth", "mean", -100, true, 0.15},
      {"mean_weighted", "mean", -100, false, 0, true},
      {"sum_weighted_ignore", "sum", -100, true, 0, true},
      {"mean_weighted_ignore_smooth", "mean", -100, true, 0.1, true},
      {"none_weighted_smooth", "none", -100, false, 0.1, true},
  };
}

torch::nn::CrossEntropyLossOptions options_of(const Variant& v, torch::Dtype dtype) {
  torch::nn::CrossEntropyLossOptions o;
  if (v.reduction == "sum") o.reduction(torch::kSum);
  else if (v.reduction == "none") o.reduction(torch::kNone);
  else o.reduction(torch::kMean);
  o.ignore_index(v.ignore_index).label_smoothing(v.smoothing);
  if (v.weighted) o.weight(torch::linspace(0.5, 2.0, kVocab, dtype));
  return o;
}

torch::Tensor targets(const Variant& v) {
  auto t = torch::randint(0, kVocab, {kRows}, torch::kLong);
  // Every class appears, so every rank owns some targets.
  t.slice(0, 0, kVocab).copy_(torch::arange(kVocab));
  if (v.some_ignored) t.index_put_({torch::tensor({1, 4, 9}, torch::kLong)}, v.ignore_index);
  return t;
}

struct Case {
  int world;
  torch::Dtype dtype;
  Variant variant;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.variant.name << " world " << c.world; }

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.variant.name + "_ws" + std::to_string(info.param.world) +
         (info.param.dtype == torch::kDouble ? "_f64" : "_f32");
}

class CrossEntropyParity : public ::testing::TestWithParam<Case> {};

TEST_P(CrossEntropyParity, MatchesTorchOnFullLogits) {
  const Case& c = GetParam();
  torch::manual_seed(77);
  auto reference = std::make_shared<LMImpl>(options_of(c.variant, c.dtype));
  reference->to(c.dtype);
  parity::Setup s;
  s.world = c.world;
  s.dtype = c.dtype;
  for (int step = 0; step < s.steps; ++step)
    s.inputs.push_back({torch::randn({kRows, kIn}, c.dtype), targets(c.variant)});
  s.forward = [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
    return dynamic_cast<LMImpl&>(m).forward(in[0], in[1]);
  };
  s.local = [](const std::string& name, const torch::Tensor& full, int rank, int world) {
    return name.rfind("head.", 0) == 0 ? shardplan::shard_of(full, 0, world, rank) : full;
  };
  shardplan::testing::reset_vocab_parallel_widest();
  for (const auto& f : parity::compare(reference, lm_plan(), s)) ADD_FAILURE() << f;
  // Every tensor the loss made, forward and backward, on every rank, held
  // at most this rank's classes. Over one rank the plugin leaves the loss to
  // torch (nothing is split), so the vocab-parallel path makes nothing.
  EXPECT_EQ(shardplan::testing::vocab_parallel_widest(), c.world == 1 ? 0 : kVocab / c.world);
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (const auto& v : variants())
    for (int world : {1, 2, 4})
      for (auto dtype : {torch::kDouble, torch::kFloat}) out.push_back({world, dtype, v});
  return out;
}

INSTANTIATE_TEST_SUITE_P(CrossEntropy, CrossEntropyParity, ::testing::ValuesIn(all_cases()), case_name);

// ------------------------------------------------------------ the module

TEST(CrossEntropyLoss, UnshardedIsBitIdenticalToTorch) {
  torch::manual_seed(5);
  for (const auto& v : variants()) {
    auto o = options_of(v, torch::kDouble);
    torch::nn::CrossEntropyLoss theirs(o);
    CrossEntropyLoss ours(o);
    auto logits = torch::randn({kRows, kVocab}, torch::kDouble);
    auto t = targets(v);
    auto a = logits.clone().requires_grad_(true), b = logits.clone().requires_grad_(true);
    auto la = ours->forward(a, t), lb = theirs->forward(b, t);
    EXPECT_TRUE(torch::equal(la, lb)) << v.name;
    (la.sum()).backward();
    (lb.sum()).backward();
    EXPECT_TRUE(torch::equal(a.grad(), b.grad())) << v.name;
  }
  // Same state_dict keys as torch's, so checkpoints move between them.
  auto o = torch::nn::CrossEntropyLossOptions().weight(torch::ones(kVocab));
  EXPECT_EQ(torch::nn::CrossEntropyLoss(o)->named_buffers().keys(), CrossEntropyLoss(o)->named_buffers().keys());
}

// ------------------------------------------------------- the functional

// Full logits and their per-rank slices along the class dim, checked
// against torch for shapes the module test does not reach: (N, C, d) and
// unbatched (C).
void functional_case(const std::vector<int64_t>& shape, const Variant& v, int world) {
  torch::manual_seed(11);
  const int64_t cd = shape.size() == 1 ? 0 : 1;
  auto full = torch::randn(shape, torch::kDouble);
  auto tshape = shape;
  tshape.erase(tshape.begin() + cd);
  auto target = torch::randint(0, shape[cd], tshape, torch::kLong);
  if (v.some_ignored && target.numel() > 1) target.view(-1)[0] = v.ignore_index;
  // A lone ignored sample makes torch's mean 0/0; keep the unbatched one counted.
  if (target.dim() == 0) target.fill_(5);
  auto o = options_of(v, torch::kDouble);
  if (v.weighted) o.weight(torch::linspace(0.5, 2.0, shape[cd], torch::kDouble));
  auto ref_in = full.clone().requires_grad_(true);
  auto ref = torch::nn::functional::cross_entropy(ref_in, target, o);
  auto probe = torch::linspace(0.5, 1.5, ref.numel(), torch::kDouble).view(ref.sizes());
  (ref * probe).sum().backward();

  std::mutex mu;
  std::vector<std::string> bad;
  shardplan::testing::reset_vocab_parallel_widest();
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    auto mine = shardplan::shard_of(full, cd, world, w.rank()).clone().requires_grad_(true);
    auto loss = shardplan::vocab_parallel_cross_entropy(mine, target, w.comm(), o);
    (loss * probe).sum().backward();
    const double e1 = parity::rel_err(loss.detach(), ref.detach());
    const double e2 = parity::rel_err(mine.grad(), shardplan::shard_of(ref_in.grad(), cd, world, w.rank()));
    std::lock_guard<std::mutex> lock(mu);
    if (!(e1 <= 1e-12)) bad.push_back("rank " + std::to_string(w.rank()) + " loss " + std::to_string(e1));
    if (!(e2 <= 1e-12)) bad.push_back("rank " + std::to_string(w.rank()) + " grad " + std::to_string(e2));
  });
  for (const auto& b : bad) ADD_FAILURE() << v.name << " shape " << shape.size() << "d world " << world << ": " << b;
  EXPECT_EQ(shardplan::testing::vocab_parallel_widest(), shape[cd] / world);
}

TEST(VocabParallelCrossEntropy, FunctionalMatchesTorchForEveryInputRank) {
  for (const auto& v : variants())
    for (int world : {1, 2, 4}) {
      functional_case({kRows, kVocab}, v, world);
      functional_case({3, kVocab, 4}, v, world);
      functional_case({kVocab}, v, world);
    }
}

TEST(VocabParallelCrossEntropy, RejectsWhatItCannotCompute) {
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
    auto x = torch::randn({4, 3}, torch::kDouble);
    auto call = [&](const torch::Tensor& t, torch::nn::CrossEntropyLossOptions o = {}) -> std::string {
      try {
        shardplan::vocab_parallel_cross_entropy(x, t, w.comm(), o);
      } catch (const std::exception& e) {
        return e.what();
      }
      return "";
    };
    // Every rank throws before communicating, so none is left waiting.
    EXPECT_NE(call(torch::rand({4, 6}, torch::kDouble)).find("class-probability targets"), std::string::npos);
    EXPECT_NE(call(torch::zeros({5}, torch::kLong)).find("does not match"), std::string::npos);
    EXPECT_NE(call(torch::zeros({4}, torch::kLong), torch::nn::CrossEntropyLossOptions().weight(torch::ones(5)))
                  .find("class weights"),
              std::string::npos);
  });
}

// ------------------------------------------------------------ the plan

struct VanillaLossModelImpl : torch::nn::Module {
  VanillaLossModelImpl() {
    head = register_module("head", Linear(4, 8));
    loss = register_module("loss", torch::nn::CrossEntropyLoss());
  }
  Linear head{nullptr};
  torch::nn::CrossEntropyLoss loss{nullptr};
};

struct NoPluginImpl : torch::nn::Module {};

struct ActModelImpl : torch::nn::Module {
  ActModelImpl() {
    fc = register_module("fc", Linear(torch::nn::LinearOptions(4, 4).bias(false)));
    register_module("fcact", torch::nn::Tanh());
    register_module("custom", std::make_shared<NoPluginImpl>());
  }
  Linear fc{nullptr};
};

std::string check_error(torch::nn::Module& m, const std::string& rules, int world = 2) {
  try {
    shardplan::check_plan(m, shardplan::parse_plan("mesh: {model: auto}\nrules:\n" + rules, "bad.yaml"), world);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(CrossEntropyPlan, ReportShowsTheLossRow) {
  LMImpl m(torch::nn::CrossEntropyLossOptions{});
  auto report = shardplan::check_plan(m, lm_plan(), 4);
  ASSERT_EQ(report.rows.size(), 5u);  // fc1.weight, fc1.bias, head.weight, head.bias, then the loss
  EXPECT_EQ(report.rows[4].path, "loss");
  EXPECT_EQ(report.rows[4].plugin, "cross_entropy");
  EXPECT_EQ(report.rows[4].layout, "[null, model]");
  EXPECT_NE(report.rows[4].note.find("vocab-parallel"), std::string::npos) << report.rows[4].note;
  EXPECT_EQ(report.rows[4].rule.rfind("ce.yaml:4:", 0), 0u) << report.rows[4].rule;
  EXPECT_NE(report.table().find("loss"), std::string::npos);
}

TEST(CrossEntropyPlan, BadLayoutsAndOptionsAreRejectedAtTheRule) {
  LMImpl m(torch::nn::CrossEntropyLossOptions{});
  const std::string head = "  - {match: 'head\\.weight', layout: [model, null], output: sharded}\n";
  auto batch = check_error(m, head + "  - {match: 'loss', layout: [model, null]}\n");
  EXPECT_NE(batch.find("bad.yaml:4:"), std::string::npos) << batch;
  EXPECT_NE(batch.find("only along the class dim"), std::string::npos) << batch;
  auto opt = check_error(m, head + "  - {match: 'loss', layout: [null, model], output: sharded}\n");
  EXPECT_NE(opt.find("option 'output' does not apply to a loss"), std::string::npos) << opt;
  auto input = check_error(m, head + "  - {match: 'loss', layout: [null, model], input: replicated}\n");
  EXPECT_NE(input.find("contradicts"), std::string::npos) << input;
  auto empty = check_error(m, head + "  - {match: 'loss', layout: []}\n");
  EXPECT_NE(empty.find("one entry per dim"), std::string::npos) << empty;
  auto plugin = check_error(m, head + "  - {match: 'loss', layout: [null, model], plugin: dense}\n");
  EXPECT_NE(plugin.find("does not handle 'loss'"), std::string::npos) << plugin;
}

TEST(CrossEntropyPlan, ClassWeightsMustDivide) {
  LMImpl m(torch::nn::CrossEntropyLossOptions().weight(torch::ones(kVocab)));
  auto msg = check_error(m, "  - {match: 'loss', layout: [null, model]}\n", 3);
  EXPECT_NE(msg.find("8 class weights are not divisible by mesh axis 'model' of size 3"), std::string::npos) << msg;
  EXPECT_EQ(check_error(m, "  - {match: 'loss', layout: [null, model]}\n", 4), "");
}

TEST(CrossEntropyPlan, ModuleRulesReachOnlyModulesAPluginHandles) {
  VanillaLossModelImpl vanilla;
  auto v = check_error(vanilla, "  - {match: 'loss', layout: [null, model]}\n");
  EXPECT_NE(v.find("bad.yaml:3:"), std::string::npos) << v;
  EXPECT_NE(v.find("build the model with shardplan::nn::CrossEntropyLoss"), std::string::npos) << v;

  ActModelImpl act;
  auto custom = check_error(act, "  - {match: 'custom', layout: [null, model]}\n");
  EXPECT_NE(custom.find("no layer plugin handles"), std::string::npos) << custom;
  // A rule that also matches parameters passes over parameterless modules no
  // plugin handles, so catch-all parameter rules keep working.
  EXPECT_EQ(check_error(act, "  - {match: 'fc.*', layout: [null, null]}\n"), "");
  EXPECT_EQ(check_error(act, "  - {match: '.*', layout: [null, null]}\n"), "");
  // A rule matching nothing at all is still caught.
  auto none = check_error(act, "  - {match: 'lossx', layout: [null, model]}\n");
  EXPECT_NE(none.find("matched no parameter"), std::string::npos) << none;
}

TEST(CrossEntropyPlan, ReplicatedLayoutKeepsTorchLoss) {
  torch::manual_seed(3);
  auto ref = std::make_shared<LMImpl>(torch::nn::CrossEntropyLossOptions{});
  auto copy = std::dynamic_pointer_cast<LMImpl>(ref->clone());
  auto x = torch::randn({kRows, kIn});
  auto t = torch::randint(0, kVocab, {kRows}, torch::kLong);
  shardplan::run_ranks_in_threads(1, [&](shardplan::World& w) {
    shardplan::parallelize(*copy, shardplan::parse_plan("mesh: {model: auto}\nrules:\n"
                                                        "  - {match: 'loss', layout: [null, null]}\n"),
                           w);
  });
  EXPECT_EQ(copy->loss->strategy(), nullptr);
  EXPECT_TRUE(torch::equal(copy->forward(x, t), ref->forward(x, t)));
}

TEST(CrossEntropyPlan, LayoutRankMustMatchTheLogits) {
  // Plan time cannot know the logits' rank, so the strategy checks it on
  // every forward, before communicating.
  auto m = std::make_shared<LMImpl>(torch::nn::CrossEntropyLossOptions{});
  std::vector<std::shared_ptr<LMImpl>> copies;
  for (int r = 0; r < 2; ++r) copies.push_back(std::dynamic_pointer_cast<LMImpl>(m->clone()));
  std::mutex mu;
  std::vector<std::string> msgs;
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& w) {
    auto& copy = *copies[w.rank()];
    shardplan::parallelize(copy, shardplan::parse_plan("mesh: {model: auto}\nrules:\n"
                                                       "  - {match: 'loss', layout: [null, model, null]}\n"),
                           w);
    std::string msg;
    try {
      copy.forward(torch::randn({kRows, kIn}), torch::zeros({kRows}, torch::kLong));
    } catch (const std::exception& e) {
      msg = e.what();
    }
    std::lock_guard<std::mutex> lock(mu);
    msgs.push_back(msg);
  });
  ASSERT_EQ(msgs.size(), 2u);
  for (const auto& msg : msgs)
    EXPECT_NE(msg.find("layout has 3 dims but the logits have 2"), std::string::npos) << msg;
}

}  // namespace

}  // namespace test_cross_entropy
