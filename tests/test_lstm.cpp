// shardplan::nn::LSTM as a drop-in for torch::nn::LSTM (initialisation,
// forward, gradients, checkpoints), and the lstm plugin (hidden-parallel,
// gate-aware) against the same model run unsharded: one and two layers,
// bidirectional, batch_first, without biases, with initial states, at world
// sizes 1, 2 and 4 in float64 and float32, SGD and Adam; inter-layer dropout
// in training mode (the same masks on every rank).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "shardplan/error.h"
#include "shardplan/nn/lstm.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"
#include "parity.h"

namespace test_lstm {

namespace {

using Options = torch::nn::LSTMOptions;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "shardplan_" + name + "_" + std::to_string(::getpid());
}

#define EXPECT_HAS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << (msg)

// ------------------------------------------------------ drop-in for torch

std::vector<Options> option_variety() {
  return {
      Options(5, 6),
      Options(5, 6).num_layers(3),
      Options(5, 6).bidirectional(true),
      Options(5, 6).num_layers(2).bidirectional(true).batch_first(true),
      Options(5, 6).bias(false).num_layers(2),
      Options(5, 6).num_layers(2).dropout(0.5),
      Options(5, 6).num_layers(2).proj_size(3).bidirectional(true),
  };
}

void expect_equal_grads(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  for (const auto& kv : pa) {
    SCOPED_TRACE(kv.key());
    ASSERT_TRUE(kv.value().grad().defined());
    EXPECT_TRUE(torch::equal(kv.value().grad(), pb[kv.key()].grad()));
  }
}

TEST(LSTM, InitialisationForwardBackwardAndPrintMatchTorch) {
  int n = 0;
  for (const auto& o : option_variety()) {
    SCOPED_TRACE("options #" + std::to_string(n++));
    torch::manual_seed(11);
    torch::nn::LSTM ref(o);
    torch::manual_seed(11);
    shardplan::nn::LSTM ours(o);
    ASSERT_EQ(ref->named_parameters().keys(), ours->named_parameters().keys());
    for (const auto& kv : ref->named_parameters())
      EXPECT_TRUE(torch::equal(kv.value(), ours->named_parameters()[kv.key()])) << kv.key();
    const int64_t batch = 3, steps = 4, states = o.num_layers() * (o.bidirectional() ? 2 : 1);
    auto x = o.batch_first() ? torch::randn({batch, steps, 5}) : torch::randn({steps, batch, 5});
    const int64_t h_size = o.proj_size() > 0 ? o.proj_size() : o.hidden_size();
    auto h0 = torch::randn({states, batch, h_size}), c0 = torch::randn({states, batch, o.hidden_size()});
    for (bool with_state : {false, true}) {
      SCOPED_TRACE(with_state ? "with initial states" : "zero states");
      // Training mode: dropout (options #5) draws from the global generator
      // in at::lstm, the same draws for both.
      torch::manual_seed(3);
      auto r = with_state ? ref->forward(x, std::make_tuple(h0, c0)) : ref->forward(x);
      torch::manual_seed(3);
      auto s = with_state ? ours->forward(x, std::make_tuple(h0, c0)) : ours->forward(x);
      EXPECT_TRUE(torch::equal(std::get<0>(r), std::get<0>(s)));
      EXPECT_TRUE(torch::equal(std::get<0>(std::get<1>(r)), std::get<0>(std::get<1>(s))));
      EXPECT_TRUE(torch::equal(std::get<1>(std::get<1>(r)), std::get<1>(std::get<1>(s))));
      ref->zero_grad();
      ours->zero_grad();
      auto loss = [](const std::tuple<torch::Tensor, std::tuple<torch::Tensor, torch::Tensor>>& y) {
        return std::get<0>(y).sum() + std::get<0>(std::get<1>(y)).sum() * 2 + std::get<1>(std::get<1>(y)).sum() * 3;
      };
      loss(r).backward();
      loss(s).backward();
      expect_equal_grads(*ref, *ours);
    }
    std::ostringstream a, b;
    ref->pretty_print(a);
    ours->pretty_print(b);
    EXPECT_EQ("shardplan" + a.str().substr(5), b.str());
  }
}

TEST(LSTM, WorksInsideSequentialAndRejectsBadShapesLikeTorch) {
  torch::nn::Sequential seq(shardplan::nn::LSTM(Options(5, 6)));
  auto y = seq->forward<std::tuple<torch::Tensor, std::tuple<torch::Tensor, torch::Tensor>>>(torch::randn({4, 3, 5}));
  EXPECT_EQ(std::get<0>(y).sizes(), (std::vector<int64_t>{4, 3, 6}));
  shardplan::nn::LSTM lstm(Options(5, 6).num_layers(2));
  EXPECT_THROW(lstm->forward(torch::randn({4, 3, 4})), c10::Error);
  EXPECT_THROW(
      lstm->forward(torch::randn({4, 3, 5}), std::make_tuple(torch::zeros({1, 3, 6}), torch::zeros({2, 3, 6}))),
      c10::Error);
}

TEST(LSTM, VanillaCheckpointLoadsIntoItAndBack) {
  const auto o = Options(5, 6).num_layers(2).bidirectional(true);
  torch::manual_seed(1);
  torch::nn::LSTM vanilla(o);
  torch::manual_seed(99);  // different init, so loading must overwrite it
  shardplan::nn::LSTM ours(o);
  const std::string p1 = temp_path("lstm_vanilla.pt"), p2 = temp_path("lstm_ours.pt");
  torch::save(vanilla, p1);
  torch::load(ours, p1);
  auto x = torch::randn({4, 3, 5});
  EXPECT_TRUE(torch::equal(std::get<0>(vanilla->forward(x)), std::get<0>(ours->forward(x))));
  torch::manual_seed(5);
  torch::nn::LSTM back(o);
  torch::save(ours, p2);
  torch::load(back, p2);
  EXPECT_TRUE(torch::equal(std::get<0>(vanilla->forward(x)), std::get<0>(back->forward(x))));
  std::remove(p1.c_str());
  std::remove(p2.c_str());
}

// ---------------------------------------------------------------- parity

struct Spec {
  std::string name;
  int64_t layers = 1;
  bool bidirectional = false, batch_first = false, bias = true, states = false;
  double dropout = 0;  // in eval mode
  bool bias_rule = true;  // false: the biases are not planned and follow the weights
};

constexpr int64_t kIn = 5, kHidden = 8, kBatch = 3, kSteps = 5;

struct NetImpl : torch::nn::Cloneable<NetImpl> {
  explicit NetImpl(const Spec& spec) : spec(spec) { reset(); }
  void reset() override {
    lstm = register_module("lstm", shardplan::nn::LSTM(Options(kIn, kHidden)
                                                             .num_layers(spec.layers)
                                                             .bidirectional(spec.bidirectional)
                                                             .batch_first(spec.batch_first)
                                                             .bias(spec.bias)
                                                             .dropout(spec.dropout)));
  }
  // Everything the LSTM returns, so each part's gradient is checked.
  torch::Tensor forward(const std::vector<torch::Tensor>& in) {
    auto y = in.size() == 3 ? lstm->forward(in[0], std::make_tuple(in[1], in[2])) : lstm->forward(in[0]);
    return torch::cat({std::get<0>(y).flatten(), std::get<0>(std::get<1>(y)).flatten(),
                       std::get<1>(std::get<1>(y)).flatten()});
  }
  Spec spec;
  shardplan::nn::LSTM lstm{nullptr};
};

std::vector<Spec> specs() {
  std::vector<Spec> out;
  out.push_back({"single"});
  Spec two;
  two.name = "two_layers";
  two.layers = 2;
  out.push_back(two);
  Spec bi;
  bi.name = "bidirectional";
  bi.bidirectional = true;
  out.push_back(bi);
  Spec bi2 = two;
  bi2.name = "bidirectional_two_layers_states";
  bi2.bidirectional = true;
  bi2.states = true;
  out.push_back(bi2);
  Spec bf = two;
  bf.name = "batch_first";
  bf.batch_first = true;
  out.push_back(bf);
  Spec nobias = two;
  nobias.name = "no_bias";
  nobias.bias = false;
  out.push_back(nobias);
  Spec states;
  states.name = "initial_states";
  states.states = true;
  out.push_back(states);
  Spec inferred = two;
  inferred.name = "biases_follow_weights";
  inferred.bias_rule = false;
  out.push_back(inferred);
  Spec dropout = two;
  dropout.name = "dropout_eval";
  dropout.dropout = 0.4;
  out.push_back(dropout);
  return out;
}

struct Case {
  int world;
  torch::Dtype dtype;
  bool adam;
  Spec spec;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.spec.name << " world " << c.world; }

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return c.spec.name + "_ws" + std::to_string(c.world) + (c.dtype == torch::kDouble ? "_f64" : "_f32") +
         (c.adam ? "_adam" : "_sgd");
}

std::string plan_text(const Spec& s) {
  std::string rules = "  - {match: 'lstm\\.weight_.*', layout: [model, null]}\n";
  if (s.bias && s.bias_rule) rules += "  - {match: 'lstm\\.bias_.*', layout: [model]}\n";
  return "mesh: {model: auto}\nrules:\n" + rules;
}

std::vector<std::string> run_parity(const Case& c) {
  torch::manual_seed(1234);
  auto reference = std::make_shared<NetImpl>(c.spec);
  reference->to(c.dtype);
  if (c.spec.dropout > 0) reference->eval();
  parity::Setup s;
  s.world = c.world;
  s.dtype = c.dtype;
  s.adam = c.adam;
  const int64_t states = c.spec.layers * (c.spec.bidirectional ? 2 : 1);
  for (int step = 0; step < s.steps; ++step) {
    std::vector<torch::Tensor> in = {c.spec.batch_first ? torch::randn({kBatch, kSteps, kIn}, c.dtype)
                                                        : torch::randn({kSteps, kBatch, kIn}, c.dtype)};
    if (c.spec.states) {
      in.push_back(torch::randn({states, kBatch, kHidden}, c.dtype));
      in.push_back(torch::randn({states, kBatch, kHidden}, c.dtype));
    }
    s.inputs.push_back(in);
  }
  s.forward = [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
    return dynamic_cast<NetImpl&>(m).forward(in);
  };
  s.local = [](const std::string&, const torch::Tensor& full, int rank, int world) {
    return shardplan::shard_of(full, 0, world, rank, /*blocks=*/4);
  };
  return parity::compare(reference, shardplan::parse_plan(plan_text(c.spec), c.spec.name + ".yaml"), s);
}

class LSTMParity : public ::testing::TestWithParam<Case> {};

TEST_P(LSTMParity, MatchesUnshardedModel) {
  for (const auto& f : run_parity(GetParam())) ADD_FAILURE() << f;
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (const auto& spec : specs())
    for (int world : {1, 2, 4})
      for (auto dtype : {torch::kDouble, torch::kFloat}) out.push_back({world, dtype, false, spec});
  // Adam's state is elementwise, so the shards must follow it exactly too.
  for (const auto& spec : specs())
    if (spec.name == "bidirectional_two_layers_states" || spec.name == "batch_first")
      for (auto dtype : {torch::kDouble, torch::kFloat}) out.push_back({4, dtype, true, spec});
  return out;
}

INSTANTIATE_TEST_SUITE_P(LSTM, LSTMParity, ::testing::ValuesIn(all_cases()), case_name);

// Ranks as threads: each gets a clone made before any is sharded.
template <class Fn>
void on_ranks(const std::shared_ptr<NetImpl>& reference, const std::string& plan_yaml, int world, Fn fn) {
  std::vector<std::shared_ptr<NetImpl>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(std::dynamic_pointer_cast<NetImpl>(reference->clone()));
  auto plan = shardplan::parse_plan(plan_yaml);
  shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
    auto m = replicas[w.rank()];
    shardplan::parallelize(*m, plan, w);
    fn(w.rank(), *m);
  });
}

TEST(LSTMParallel, ShardsHoldEachGateSliceAndPrintTheStrategy) {
  Spec spec;
  torch::manual_seed(3);
  auto reference = std::make_shared<NetImpl>(spec);
  const auto full = reference->lstm->named_parameters()["weight_hh_l0"].clone();
  std::vector<torch::Tensor> shards(2);
  std::vector<std::string> printed(2);
  on_ranks(reference, plan_text(spec), 2, [&](int rank, NetImpl& m) {
    shards[rank] = m.lstm->named_parameters()["weight_hh_l0"].detach().clone();
    std::ostringstream os;
    m.lstm->pretty_print(os);
    printed[rank] = os.str();
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(shards[r].sizes(), (std::vector<int64_t>{16, 8}));
    for (int gate = 0; gate < 4; ++gate)
      EXPECT_TRUE(torch::equal(shards[r].narrow(0, gate * 4, 4), full.narrow(0, gate * 8 + r * 4, 4)))
          << "rank " << r << " gate " << gate;
  }
  EXPECT_HAS(printed[1], "hidden-parallel over 'model' (2)");
}

// Inter-layer dropout in training mode: the masks come from the RNG tracker's
// replicated stream (seeded from torch's seed, the same on every rank), so
// the plan at world sizes 2 and 4 must train exactly as at world size 1,
// which draws the same masks; the unsharded torch::nn path (global generator)
// draws others, so it cannot be the reference here.
std::vector<parity::Trace> traces_on_ranks(const std::shared_ptr<NetImpl>& reference, const std::string& plan_yaml,
                                           const parity::Setup& s) {
  std::vector<std::shared_ptr<NetImpl>> replicas;
  for (int r = 0; r < s.world; ++r) replicas.push_back(std::dynamic_pointer_cast<NetImpl>(reference->clone()));
  auto plan = shardplan::parse_plan(plan_yaml);
  std::vector<parity::Trace> traces(s.world);
  shardplan::run_ranks_in_threads(s.world, [&](shardplan::World& w) {
    auto m = replicas[w.rank()];
    shardplan::parallelize(*m, plan, w);
    traces[w.rank()] = parity::train(*m, s, torch::tensor(1.0, torch::kDouble));
  });
  return traces;
}

TEST(LSTMParallel, DropoutInTrainingDrawsTheSameMasksOnEveryRank) {
  Spec spec;
  spec.layers = 3;
  spec.dropout = 0.4;
  torch::manual_seed(4);
  auto reference = std::make_shared<NetImpl>(spec);
  reference->to(torch::kDouble);
  parity::Setup s;
  s.dtype = torch::kDouble;
  for (int step = 0; step < s.steps; ++step) s.inputs.push_back({torch::randn({kSteps, kBatch, kIn}, torch::kDouble)});
  s.forward = [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
    return dynamic_cast<NetImpl&>(m).forward(in);
  };
  s.world = 1;
  const auto expected = traces_on_ranks(reference, plan_text(spec), s)[0];
  // The masks are really applied: eval mode gives another output.
  auto eval_model = std::dynamic_pointer_cast<NetImpl>(reference->clone());
  eval_model->eval();
  EXPECT_GT(parity::rel_err(eval_model->forward({s.inputs[0][0]}).detach(), expected.outputs[0]), 1e-3);
  for (int world : {2, 4}) {
    s.world = world;
    const auto traces = traces_on_ranks(reference, plan_text(spec), s);
    for (int r = 0; r < world; ++r) {
      SCOPED_TRACE("world " + std::to_string(world) + " rank " + std::to_string(r));
      const auto& got = traces[r];
      for (int step = 0; step < s.steps; ++step) {
        EXPECT_LE(parity::rel_err(got.outputs[step], expected.outputs[step]), 1e-12) << "step " << step;
        EXPECT_LE(parity::rel_err(got.input_grads[step][0], expected.input_grads[step][0]), 1e-12) << "step " << step;
      }
      for (const auto& kv : expected.grads) {
        EXPECT_LE(parity::rel_err(got.grads.at(kv.first), shardplan::shard_of(kv.second, 0, world, r, 4)), 1e-12)
            << kv.first;
        EXPECT_LE(parity::rel_err(got.params.at(kv.first), shardplan::shard_of(expected.params.at(kv.first), 0, world,
                                                                                   r, 4)),
                  1e-12)
            << kv.first;
      }
    }
  }
}

// A replicated LSTM (no rule) in a parallelized model would otherwise draw its
// masks from torch's generator, which ranks as threads share: a different mask
// on each rank.
TEST(LSTMParallel, ReplicatedLSTMDrawsTheSameDropoutMasksOnEveryRank) {
  Spec spec;
  spec.layers = 3;
  spec.bidirectional = true;
  spec.dropout = 0.5;
  torch::manual_seed(6);
  auto reference = std::make_shared<NetImpl>(spec);
  auto x = torch::randn({kSteps, kBatch, kIn});
  auto eval_model = std::dynamic_pointer_cast<NetImpl>(reference->clone());
  eval_model->eval();
  const auto no_dropout = eval_model->forward({x}).detach();
  std::vector<torch::Tensor> outs(2);
  on_ranks(reference, "mesh: {model: auto}\nrules: []\n", 2, [&](int rank, NetImpl& m) {
    EXPECT_FALSE(m.lstm->strategy());
    outs[rank] = m.forward({x}).detach();
  });
  EXPECT_TRUE(torch::equal(outs[0], outs[1]));
  EXPECT_GT(parity::rel_err(outs[0], no_dropout), 1e-3);
}

TEST(LSTMParallel, DropoutInTrainingWithoutATrackerIsRejected) {
  Spec spec;
  spec.layers = 2;
  spec.dropout = 0.3;
  torch::manual_seed(4);
  auto reference = std::make_shared<NetImpl>(spec);
  auto x = torch::randn({kSteps, kBatch, kIn});
  std::vector<std::string> errors(2);
  on_ranks(reference, plan_text(spec), 2, [&](int rank, NetImpl& m) {
    // Another thread has no tracker: torch's shared generator would give each
    // rank its own mask.
    std::thread other([&] {
      try {
        m.forward({x});
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
    other.join();
    m.eval();
    EXPECT_NO_THROW(m.forward({x}));
  });
  for (const auto& e : errors) {
    EXPECT_HAS(e, "LSTM 'lstm'");
    EXPECT_HAS(e, "no RNG tracker");
  }
}

// ---------------------------------------------------------------- bad plans

std::string check_error(torch::nn::Module& m, const std::string& rules, int world = 2) {
  try {
    shardplan::check_plan(m, shardplan::parse_plan("mesh: {model: auto}\nrules:\n" + rules, "bad.yaml"), world);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

struct Holder : torch::nn::Module {
  explicit Holder(const Options& o) { lstm = register_module("lstm", shardplan::nn::LSTM(o)); }
  shardplan::nn::LSTM lstm{nullptr};
};

TEST(LSTMPlan, HiddenSizeNotDivisibleNamesParameterAndRule) {
  Holder m(Options(5, 6));
  auto msg = check_error(m, "  - {match: 'lstm\\.weight_.*', layout: [model, null]}\n", 4);
  EXPECT_HAS(msg, "bad.yaml:3:");
  EXPECT_HAS(msg, "'lstm.weight_ih_l0'");
  EXPECT_HAS(msg, "hidden_size 6 is not divisible by mesh axis 'model' of size 4");
}

TEST(LSTMPlan, MismatchedAndMisplacedLayoutsAreRejected) {
  Holder m(Options(5, 8).num_layers(2));
  auto input_dim = check_error(m, "  - {match: 'lstm\\.weight_.*', layout: [null, model]}\n");
  EXPECT_HAS(input_dim, "bad.yaml:3:");
  EXPECT_HAS(input_dim, "input dim of an LSTM weight cannot be split");
  auto only_ih = check_error(m, "  - {match: 'lstm\\.weight_ih_.*', layout: [model, null]}\n");
  EXPECT_HAS(only_ih, "'lstm.weight_hh_l0'");
  EXPECT_HAS(only_ih, "must have layout [model, null]");
  auto one_layer = check_error(m, "  - {match: 'lstm\\.weight_.._l0', layout: [model, null]}\n");
  EXPECT_HAS(one_layer, "'lstm.weight_ih_l1'");
  auto bias = check_error(m,
                          "  - {match: 'lstm\\.weight_.*', layout: [model, null]}\n"
                          "  - {match: 'lstm\\.bias_hh_l1', layout: [null]}\n");
  EXPECT_HAS(bias, "'lstm.bias_hh_l1'");
  EXPECT_HAS(bias, "follow its weights");
  auto split_bias = check_error(m, "  - {match: 'lstm\\.bias_.*', layout: [model]}\n");
  EXPECT_HAS(split_bias, "weights are replicated");
  auto output = check_error(m, "  - {match: 'lstm\\.weight_.*', layout: [model, null], output: sharded}\n");
  EXPECT_HAS(output, "option 'output'");
  auto blocks = check_error(m, "  - {match: 'lstm\\.weight_.*', layout: [model, null], blocks: 3}\n");
  EXPECT_HAS(blocks, "option 'blocks'");
  EXPECT_EQ(check_error(m, "  - {match: 'lstm\\.weight_.*', layout: [model, null], blocks: 4}\n"), "");
}

TEST(LSTMPlan, ProjectionCannotBeSharded) {
  Holder m(Options(5, 8).proj_size(4));
  auto msg = check_error(m, "  - {match: 'lstm\\.weight_.h_.*', layout: [model, null]}\n");
  EXPECT_HAS(msg, "proj_size > 0 cannot be sharded");
}

TEST(LSTMPlan, VanillaTorchLSTMIsRejectedNamingTheTypeToUse) {
  struct VanillaImpl : torch::nn::Module {
    VanillaImpl() { lstm = register_module("lstm", torch::nn::LSTM(5, 8)); }
    torch::nn::LSTM lstm{nullptr};
  } m;
  auto msg = check_error(m, "  - {match: 'lstm\\.weight_.*', layout: [model, null]}\n");
  EXPECT_HAS(msg, "torch::nn::LSTMImpl");
  EXPECT_HAS(msg, "shardplan::nn::LSTM");
}

TEST(LSTMPlan, ReportGivesLocalShapes) {
  Holder m(Options(5, 8).bidirectional(true));
  auto report = shardplan::check_plan(m, shardplan::parse_plan(plan_text(Spec{})), 4);
  ASSERT_EQ(report.rows.size(), 8u);
  EXPECT_EQ(report.rows[0].local_shape, (std::vector<int64_t>{8, 5}));   // weight_ih_l0
  EXPECT_EQ(report.rows[1].local_shape, (std::vector<int64_t>{8, 8}));   // weight_hh_l0
  EXPECT_EQ(report.rows[2].local_shape, (std::vector<int64_t>{8}));      // bias_ih_l0
  EXPECT_EQ(report.rows[4].local_shape, (std::vector<int64_t>{8, 5}));   // weight_ih_l0_reverse
  EXPECT_EQ(report.rows[0].plugin, "lstm");
}

}  // namespace

}  // namespace test_lstm
