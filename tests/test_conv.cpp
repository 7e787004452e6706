// shardplan::nn::ConvNd as a drop-in for torch::nn::ConvNd (initialisation,
// forward, checkpoints), and the conv plugin against the same model run
// unsharded: output- and input-channel parallel, grouped, padding modes,
// stride and dilation, at world sizes 1, 2 and 4 in float64 and float32.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <string>
#include <type_traits>

#include "shardplan/error.h"
#include "shardplan/nn/conv.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"
#include "parity.h"

namespace test_conv {

namespace {

template <size_t D>
using OurConv = std::conditional_t<D == 1, shardplan::nn::Conv1d,
                                   std::conditional_t<D == 2, shardplan::nn::Conv2d, shardplan::nn::Conv3d>>;
template <size_t D>
using TorchConv =
    std::conditional_t<D == 1, torch::nn::Conv1d, std::conditional_t<D == 2, torch::nn::Conv2d, torch::nn::Conv3d>>;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "shardplan_" + name + "_" + std::to_string(::getpid());
}

// ------------------------------------------------------ drop-in for torch

template <size_t D>
std::vector<torch::nn::ConvOptions<D>> option_variety() {
  using O = torch::nn::ConvOptions<D>;
  return {
      O(4, 6, 3),
      O(4, 6, 3).bias(false).stride(2).padding(1),
      O(4, 6, 3).padding(2).dilation(2).padding_mode(torch::kReflect),
      O(4, 6, 3).padding(1).padding_mode(torch::kReplicate).groups(2),
      O(4, 6, 3).padding(1).padding_mode(torch::kCircular),
      O(4, 4, 3).padding(torch::kSame).groups(4),
      O(4, 4, 3).padding(torch::kSame).padding_mode(torch::kReflect),
      O(4, 6, 2).padding(torch::kValid).stride(2),
  };
}

template <size_t D>
void expect_drop_in() {
  std::vector<int64_t> shape = {2, 4};
  for (size_t i = 0; i < D; ++i) shape.push_back(7 - static_cast<int64_t>(i));
  int n = 0;
  for (const auto& o : option_variety<D>()) {
    SCOPED_TRACE("Conv" + std::to_string(D) + "d options #" + std::to_string(n++));
    torch::manual_seed(11);
    TorchConv<D> ref(o);
    torch::manual_seed(11);
    OurConv<D> ours(o);
    ASSERT_TRUE(torch::equal(ref->weight, ours->weight));
    ASSERT_EQ(ref->bias.defined(), ours->bias.defined());
    if (ref->bias.defined()) ASSERT_TRUE(torch::equal(ref->bias, ours->bias));
    EXPECT_EQ(ref->named_parameters().keys(), ours->named_parameters().keys());
    auto x = torch::randn(shape);
    EXPECT_TRUE(torch::equal(ref->forward(x), ours->forward(x)));
    std::ostringstream a, b;
    ref->pretty_print(a);
    ours->pretty_print(b);
    EXPECT_EQ("shardplan" + a.str().substr(5), b.str());
  }
}

TEST(Conv, InitialisationForwardAndPrintMatchTorch1d) { expect_drop_in<1>(); }
TEST(Conv, InitialisationForwardAndPrintMatchTorch2d) { expect_drop_in<2>(); }
TEST(Conv, InitialisationForwardAndPrintMatchTorch3d) { expect_drop_in<3>(); }

TEST(Conv, VanillaCheckpointLoadsIntoItAndBack) {
  auto o1 = torch::nn::Conv2dOptions(3, 4, 3).padding(1).padding_mode(torch::kReflect);
  auto o2 = torch::nn::Conv2dOptions(4, 2, 3).groups(2).bias(false);
  torch::manual_seed(1);
  torch::nn::Sequential vanilla(torch::nn::Conv2d(o1), torch::nn::Functional(torch::relu), torch::nn::Conv2d(o2));
  torch::manual_seed(99);  // different init, so loading must overwrite it
  torch::nn::Sequential ours(shardplan::nn::Conv2d(o1), torch::nn::Functional(torch::relu),
                             shardplan::nn::Conv2d(o2));
  const std::string p1 = temp_path("conv_vanilla.pt"), p2 = temp_path("conv_ours.pt");
  torch::save(vanilla, p1);
  torch::load(ours, p1);
  auto x = torch::randn({2, 3, 6, 5});
  EXPECT_TRUE(torch::equal(vanilla->forward(x), ours->forward(x)));
  torch::manual_seed(5);
  torch::nn::Sequential back(torch::nn::Conv2d(o1), torch::nn::Functional(torch::relu), torch::nn::Conv2d(o2));
  torch::save(ours, p2);
  torch::load(back, p2);
  EXPECT_TRUE(torch::equal(vanilla->forward(x), back->forward(x)));
  std::remove(p1.c_str());
  std::remove(p2.c_str());
}

// ---------------------------------------------------------------- parity

struct Spec {
  int64_t in = 4, mid = 8, out = 4;
  int64_t groups1 = 1, groups2 = 1;
  int64_t stride = 1, dilation = 1;
  int64_t padding = 1;  // -1: kSame
  std::string mode = "zeros";
};

template <size_t D>
torch::nn::ConvOptions<D> options(int64_t in, int64_t out, int64_t groups, const Spec& s, bool bias) {
  torch::nn::ConvOptions<D> o(in, out, 3);
  o.groups(groups).stride(s.stride).dilation(s.dilation).bias(bias);
  if (s.padding < 0) o.padding(torch::kSame);
  else o.padding(s.padding);
  if (s.mode == "reflect") o.padding_mode(torch::kReflect);
  if (s.mode == "replicate") o.padding_mode(torch::kReplicate);
  if (s.mode == "circular") o.padding_mode(torch::kCircular);
  return o;
}

template <size_t D>
struct NetImpl : torch::nn::Cloneable<NetImpl<D>> {
  NetImpl(const Spec& spec, bool bias) : spec(spec), bias(bias) { reset(); }
  void reset() override {
    c1 = this->register_module("c1", OurConv<D>(options<D>(spec.in, spec.mid, spec.groups1, spec, bias)));
    // The second conv keeps stride 1, so it sees what the first produced.
    Spec s2 = spec;
    s2.stride = 1;
    c2 = this->register_module("c2", OurConv<D>(options<D>(spec.mid, spec.out, spec.groups2, s2, bias)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return c2->forward(torch::tanh(c1->forward(x))); }
  Spec spec;
  bool bias;
  OurConv<D> c1{nullptr}, c2{nullptr};
};

using Splits = std::map<std::string, int64_t>;

struct Config {
  std::string name;
  int dims;
  Spec spec;
  std::string rules;
  Splits splits;
};


std::string layout(int dims, const std::string& a, const std::string& b) {
  std::string s = "[" + a + ", " + b;
  for (int i = 0; i < dims; ++i) s += ", null";
  return s + "]";
}

std::vector<Config> configs() {
  std::vector<Config> out;
  auto rule = [](const std::string& param, int dims, const std::string& a, const std::string& b,
                 const std::string& extra = "") {
    return "  - {match: '" + param + "', layout: " + layout(dims, a, b) + extra + "}\n";
  };
  for (int dims : {1, 2, 3}) {
    const std::string d = std::to_string(dims) + "d";
    Spec plain;
    out.push_back({"conv" + d + "_out_gathered", dims, plain, rule("c1\\.weight", dims, "model", "null"),
                   {{"c1.weight", 0}, {"c1.bias", 0}}});
    Spec chain;
    chain.mode = dims == 1 ? "circular" : dims == 2 ? "reflect" : "replicate";
    chain.dilation = dims == 1 ? 2 : 1;
    chain.padding = dims == 1 ? 2 : 1;
    out.push_back({"conv" + d + "_out_then_in_" + chain.mode, dims, chain,
                   rule("c1\\.weight", dims, "model", "null", ", output: sharded") +
                       "  - {match: 'c1\\.bias', layout: [model]}\n" +
                       rule("c2\\.weight", dims, "null", "model", ", input: sharded"),
                   {{"c1.weight", 0}, {"c1.bias", 0}, {"c2.weight", 1}}});
  }
  Spec strided;
  strided.stride = 2;
  strided.mode = "reflect";
  out.push_back({"conv2d_in_split_strided_reflect", 2, strided, rule("c1\\.weight", 2, "null", "model"),
                 {{"c1.weight", 1}}});
  Spec same;
  same.padding = -1;
  same.dilation = 2;
  out.push_back({"conv1d_in_split_same", 1, same, rule("c2\\.weight", 1, "null", "model"), {{"c2.weight", 1}}});
  // groups 4 at world 4 and 2: whole groups per rank; groups 2 at world 4:
  // two ranks share each group.
  for (int64_t g : {4, 2}) {
    Spec grouped;
    grouped.groups1 = g;
    out.push_back({"conv2d_grouped" + std::to_string(g) + "_out", 2, grouped, rule("c1\\.weight", 2, "model", "null"),
                   {{"c1.weight", 0}, {"c1.bias", 0}}});
  }
  Spec grouped_in;
  grouped_in.in = 8;
  grouped_in.groups1 = 2;
  out.push_back({"conv2d_grouped2_in_split", 2, grouped_in, rule("c1\\.weight", 2, "null", "model"),
                 {{"c1.weight", 1}}});
  // A depthwise conv inside a channel-sharded region: no communication in c2
  // until its output is gathered.
  Spec depthwise;
  depthwise.out = 8;
  depthwise.groups2 = 8;
  depthwise.mode = "replicate";
  out.push_back({"conv2d_out_then_depthwise_sharded", 2, depthwise,
                 rule("c1\\.weight", 2, "model", "null", ", output: sharded") +
                     rule("c2\\.weight", 2, "model", "null", ", input: sharded"),
                 {{"c1.weight", 0}, {"c1.bias", 0}, {"c2.weight", 0}, {"c2.bias", 0}}});
  return out;
}

struct Case {
  int world;
  torch::Dtype dtype;
  bool bias;
  Config config;
  bool adam = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.config.name << " world " << c.world; }

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return c.config.name + "_ws" + std::to_string(c.world) + (c.dtype == torch::kDouble ? "_f64" : "_f32") +
         (c.bias ? "_bias" : "_nobias") + (c.adam ? "_adam" : "");
}

template <size_t D>
std::vector<std::string> run_parity(const Case& c) {
  torch::manual_seed(1234);
  auto reference = std::make_shared<NetImpl<D>>(c.config.spec, c.bias);
  reference->to(c.dtype);
  parity::Setup s;
  s.world = c.world;
  s.dtype = c.dtype;
  s.adam = c.adam;
  std::vector<int64_t> shape = {2, c.config.spec.in};
  for (size_t i = 0; i < D; ++i) shape.push_back(D == 3 ? 3 : 6 - static_cast<int64_t>(i));
  for (int step = 0; step < s.steps; ++step) s.inputs.push_back({torch::randn(shape, c.dtype)});
  // Scaled down because the harness's SGD (lr 0.1, momentum 0.9) on a sum over
  // every output position otherwise drives the tanh into saturation, where
  // 1 - tanh^2 cancels and the sharded and unsharded summation orders drift
  // apart by more than rounding.
  s.forward = [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
    return dynamic_cast<NetImpl<D>&>(m).forward(in[0]) * 0.1;
  };
  const Splits splits = c.config.splits;
  s.local = [splits](const std::string& name, const torch::Tensor& full, int rank, int world) {
    auto it = splits.find(name);
    return it == splits.end() ? full : shardplan::shard_of(full, it->second, world, rank);
  };
  // Without biases a bias rule matches nothing, which only strict plans reject.
  auto plan = shardplan::parse_plan(std::string(c.bias ? "" : "strict: false\n") + "mesh: {model: auto}\nrules:\n" +
                                        c.config.rules,
                                    c.config.name + ".yaml");
  return parity::compare(reference, plan, s);
}

class ConvParity : public ::testing::TestWithParam<Case> {};

TEST_P(ConvParity, MatchesUnshardedModel) {
  const Case& c = GetParam();
  std::vector<std::string> failures;
  if (c.config.dims == 1) failures = run_parity<1>(c);
  if (c.config.dims == 2) failures = run_parity<2>(c);
  if (c.config.dims == 3) failures = run_parity<3>(c);
  for (const auto& f : failures) ADD_FAILURE() << f;
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (const auto& config : configs())
    for (int world : {1, 2, 4})
      for (auto dtype : {torch::kDouble, torch::kFloat})
        for (bool bias : {true, false}) {
          // Bias on/off changes no communication; float32 runs it once.
          if (dtype == torch::kFloat && !bias) continue;
          out.push_back({world, dtype, bias, config});
        }
  // Adam's state is elementwise, so shards must follow it exactly too.
  for (const auto& config : configs())
    if (config.name == "conv2d_out_then_in_reflect") out.push_back({4, torch::kDouble, true, config, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Conv, ConvParity, ::testing::ValuesIn(all_cases()), case_name);

TEST(ConvParallel, UnbatchedInputWorks) {
  torch::manual_seed(2);
  auto reference = std::make_shared<NetImpl<2>>(Spec{}, true);
  reference->to(torch::kDouble);
  auto x = torch::randn({4, 5, 6}, torch::kDouble);
  auto expected = reference->forward(x).detach();
  auto plan = shardplan::parse_plan(
      "mesh: {model: auto}\nrules:\n"
      "  - {match: 'c1\\.weight', layout: [model, null, null, null], output: sharded}\n"
      "  - {match: 'c2\\.weight', layout: [null, model, null, null], input: sharded}\n");
  std::vector<std::shared_ptr<NetImpl<2>>> replicas;
  for (int r = 0; r < 2; ++r) replicas.push_back(std::dynamic_pointer_cast<NetImpl<2>>(reference->clone()));
  std::vector<torch::Tensor> outs(2);
  std::vector<std::string> printed(2);
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& world) {
    auto m = replicas[world.rank()];
    shardplan::parallelize(*m, plan, world);
    outs[world.rank()] = m->forward(x).detach();
    std::ostringstream os;
    m->c1->pretty_print(os);
    printed[world.rank()] = os.str();
  });
  for (int r = 0; r < 2; ++r) EXPECT_LE(parity::rel_err(outs[r], expected), 1e-12) << "rank " << r;
  EXPECT_NE(printed[0].find("output-channel parallel over 'model' (2)"), std::string::npos) << printed[0];
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

#define EXPECT_HAS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << (msg)

TEST(ConvPlan, NonDivisibleChannelsNameParameterAndRule) {
  Spec s;
  s.out = 6;
  NetImpl<2> m(s, true);
  auto out = check_error(m, "  - {match: 'c2\\.weight', layout: [model, null, null, null]}\n", 4);
  EXPECT_HAS(out, "bad.yaml:3:");
  EXPECT_HAS(out, "'c2.weight'");
  EXPECT_HAS(out, "out_channels 6 is not divisible by mesh axis 'model' of size 4");
  auto in = check_error(m, "  - {match: 'c1\\.weight', layout: [null, model, null, null]}\n", 3);
  EXPECT_HAS(in, "'c1.weight'");
  EXPECT_HAS(in, "in_channels 4 is not divisible by mesh axis 'model' of size 3");
}

TEST(ConvPlan, GroupsThatDoNotAlignWithTheAxisAreRejected) {
  Spec s;
  s.in = 6;
  s.mid = 6;
  s.groups1 = 3;
  NetImpl<2> m(s, true);
  auto msg = check_error(m, "  - {match: 'c1\\.weight', layout: [model, null, null, null]}\n", 2);
  EXPECT_HAS(msg, "bad.yaml:3:");
  EXPECT_HAS(msg, "'c1.weight'");
  EXPECT_HAS(msg, "groups 3 and mesh axis 'model' of size 2");
  Spec s2;
  s2.groups1 = 2;
  NetImpl<2> m2(s2, true);
  auto in_sharded = check_error(m2, "  - {match: 'c1\\.weight', layout: [null, model, null, null], input: sharded}\n");
  EXPECT_HAS(in_sharded, "needs a piece of every group");
  auto per_group = check_error(m2, "  - {match: 'c1\\.weight', layout: [null, model, null, null]}\n", 4);
  EXPECT_HAS(per_group, "in_channels per group 2 is not divisible by mesh axis 'model' of size 4");
}

TEST(ConvPlan, MisplacedLayoutsAndOptionsAreRejected) {
  NetImpl<2> m(Spec{}, true);
  auto kernel = check_error(m, "  - {match: 'c1\\.weight', layout: [null, null, model, null]}\n");
  EXPECT_HAS(kernel, "kernel dims");
  auto both = check_error(m, "  - {match: 'c1\\.weight', layout: [model, data, null, null]}\n");
  EXPECT_FALSE(both.empty());
  auto ungrouped_sharded =
      check_error(m, "  - {match: 'c1\\.weight', layout: [model, null, null, null], input: sharded}\n");
  EXPECT_HAS(ungrouped_sharded, "bad.yaml:3:");
  EXPECT_HAS(ungrouped_sharded, "needs groups (1) divisible");
  auto bias = check_error(m,
                          "  - {match: 'c1\\.weight', layout: [model, null, null, null]}\n"
                          "  - {match: 'c1\\.bias', layout: [null]}\n");
  EXPECT_HAS(bias, "must follow its weight");
  auto in_bias = check_error(m,
                             "  - {match: 'c1\\.weight', layout: [null, model, null, null]}\n"
                             "  - {match: 'c1\\.bias', layout: [model]}\n");
  EXPECT_HAS(in_bias, "must be replicated");
  auto output = check_error(m, "  - {match: 'c1\\.weight', layout: [null, model, null, null], output: sharded}\n");
  EXPECT_HAS(output, "option 'output'");
  auto blocks = check_error(m, "  - {match: 'c1\\.weight', layout: [model, null, null, null], blocks: 2}\n");
  EXPECT_HAS(blocks, "option 'blocks'");
}

TEST(ConvPlan, VanillaTorchConvIsRejectedNamingTheTypeToUse) {
  struct VanillaImpl : torch::nn::Module {
    VanillaImpl() { c = register_module("c", torch::nn::Conv2d(4, 8, 3)); }
    torch::nn::Conv2d c{nullptr};
  } m;
  auto msg = check_error(m, "  - {match: 'c\\.weight', layout: [model, null, null, null]}\n");
  EXPECT_HAS(msg, "torch::nn::Conv2dImpl");
  EXPECT_HAS(msg, "shardplan::nn::Conv2d");
}

TEST(ConvPlan, ReportGivesLocalShapes) {
  NetImpl<1> m(Spec{}, true);
  auto plan = shardplan::parse_plan(
      "mesh: {model: auto}\nrules:\n"
      "  - {match: 'c1\\.weight', layout: [model, null, null], output: sharded}\n"
      "  - {match: 'c2\\.weight', layout: [null, model, null], input: sharded}\n");
  auto report = shardplan::check_plan(m, plan, 4);
  ASSERT_EQ(report.rows.size(), 4u);
  EXPECT_EQ(report.rows[0].local_shape, (std::vector<int64_t>{2, 4, 3}));
  EXPECT_EQ(report.rows[1].local_shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(report.rows[2].local_shape, (std::vector<int64_t>{4, 2, 3}));
  EXPECT_EQ(report.rows[3].local_shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(report.rows[0].plugin, "conv");
}

}  // namespace

}  // namespace test_conv
