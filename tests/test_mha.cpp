// shardplan::nn::MultiheadAttention as a drop-in for torch::nn::MultiheadAttention
// (initialisation, forward and gradients bit for bit, checkpoints both ways),
// and the mha plugin against the same model run unsharded: head-parallel
// in_proj or q/k/v projections with row-parallel out_proj, causal float and
// bool masks, 3-D masks, key padding, add_bias_kv, add_zero_attn, kdim/vdim,
// no bias, averaged and per-head weights, at world sizes 1, 2 and 4 in float64
// and float32 with SGD and Adam; bad plans; per-rank dropout masks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "shardplan/error.h"
#include "shardplan/nn/multihead_attention.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/shard.h"
#include "shardplan/world.h"
#include "parity.h"

namespace test_mha {

namespace {

using Options = torch::nn::MultiheadAttentionOptions;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "shardplan_" + name + "_" + std::to_string(::getpid());
}

torch::Tensor causal_float(int64_t l, int64_t s, torch::Dtype dtype = torch::kFloat) {
  return torch::full({l, s}, -std::numeric_limits<double>::infinity(), dtype).triu(1);
}

torch::Tensor causal_bool(int64_t l, int64_t s) { return torch::ones({l, s}, torch::kBool).triu(1); }

// ------------------------------------------------------ drop-in for torch

std::vector<Options> option_variety() {
  return {
      Options(16, 4),
      Options(16, 4).bias(false),
      Options(16, 4).add_bias_kv(true),
      Options(16, 4).add_zero_attn(true),
      Options(16, 2).kdim(6).vdim(6),
      Options(16, 4).kdim(6).vdim(6).bias(false).add_bias_kv(true).add_zero_attn(true),
      Options(16, 4).dropout(0.3),
  };
}

template <class A, class B>
void expect_same_grads(A& ref, B& ours) {
  auto rp = ref->named_parameters(), op = ours->named_parameters();
  for (const auto& p : rp) {
    ASSERT_TRUE(op.contains(p.key())) << p.key();
    const auto& a = p.value().grad();
    const auto& b = op[p.key()].grad();
    ASSERT_EQ(a.defined(), b.defined()) << p.key();
    if (a.defined()) EXPECT_TRUE(torch::equal(a, b)) << "grad " << p.key();
  }
}

TEST(Mha, InitialisationForwardAndGradientsMatchTorch) {
  int n = 0;
  for (const auto& o : option_variety()) {
    SCOPED_TRACE("options #" + std::to_string(n++));
    torch::manual_seed(11);
    torch::nn::MultiheadAttention ref(o);
    torch::manual_seed(11);
    shardplan::nn::MultiheadAttention ours(o);
    ASSERT_EQ(ref->named_parameters().keys(), ours->named_parameters().keys());
    for (const auto& p : ref->named_parameters())
      EXPECT_TRUE(torch::equal(p.value(), ours->named_parameters()[p.key()])) << p.key();
    EXPECT_EQ(ref->named_buffers().size(), ours->named_buffers().size());

    const int64_t L = 5, S = 7, N = 3, E = o.embed_dim();
    auto x = torch::randn({L, N, E});
    auto kv = torch::randn({S, N, o.kdim()});
    auto k = torch::randn({S, N, o.kdim()});
    auto v = torch::randn({S, N, o.vdim()});
    auto kpm = torch::zeros({N, S}, torch::kBool);
    kpm[1][S - 1] = true;
    kpm[2][S - 2] = true;
    auto kpm_self = torch::zeros({N, L}, torch::kBool);
    kpm_self[1][L - 1] = true;
    kpm_self[2][L - 2] = true;
    const bool same = o.kdim() == E;
    struct Call {
      std::string name;
      torch::Tensor q, k, v, kpm, mask;
      bool need_weights, average;
    };
    std::vector<Call> calls = {
        {"cross", x, kv, kv, kpm, {}, true, true},
        {"distinct", x, k, v, {}, {}, true, false},
        {"cross_causal_float", x, kv, kv, {}, causal_float(L, S), false, true},
    };
    if (same) {
      calls.push_back({"self", x, x, x, {}, {}, true, true});
      calls.push_back({"self_causal", x, x, x, {}, causal_float(L, L), true, false});
      calls.push_back({"self_causal_padded", x, x, x, kpm_self, causal_float(L, L), true, true});
    }
    for (auto& c : calls) {
      SCOPED_TRACE(c.name);
      auto run = [&](auto& m) {
        m->zero_grad();
        torch::manual_seed(3);  // same dropout masks
        auto r = m->forward(c.q, c.k, c.v, c.kpm, c.need_weights, c.mask, c.average);
        auto out = std::get<0>(r);
        auto loss = (out * torch::linspace(0.5, 1.5, out.numel()).view(out.sizes())).sum();
        if (c.need_weights) loss = loss + std::get<1>(r).pow(2).sum();
        loss.backward();
        return r;
      };
      auto a = run(ref);
      auto b = run(ours);
      EXPECT_TRUE(torch::equal(std::get<0>(a), std::get<0>(b)));
      ASSERT_EQ(std::get<1>(a).defined(), std::get<1>(b).defined());
      if (c.need_weights) EXPECT_TRUE(torch::equal(std::get<1>(a), std::get<1>(b)));
      expect_same_grads(ref, ours);
    }
    std::ostringstream a, b;
    ref->pretty_print(a);
    ours->pretty_print(b);
    EXPECT_EQ("shardplan" + a.str().substr(5), b.str());
  }
}

// libtorch 1.13 adds a bool mask to the scores (pytorch#80494) and throws on
// a 3-D one; these follow PyTorch instead, which is the same as the additive
// -inf mask.
TEST(Mha, BoolAndPerHeadMasksMeanWhatPyTorchSays) {
  torch::manual_seed(4);
  shardplan::nn::MultiheadAttention m(Options(16, 4).add_bias_kv(true));
  const int64_t L = 5, N = 2;
  auto x = torch::randn({L, N, 16});
  auto expected = m->forward(x, x, x, {}, true, causal_float(L, L), false);
  auto with_bool = m->forward(x, x, x, {}, true, causal_bool(L, L), false);
  auto per_head = m->forward(x, x, x, {}, true, causal_float(L, L).unsqueeze(0).expand({N * 4, L, L}).contiguous(), false);
  EXPECT_TRUE(torch::equal(std::get<0>(expected), std::get<0>(with_bool)));
  EXPECT_TRUE(torch::equal(std::get<1>(expected), std::get<1>(with_bool)));
  EXPECT_TRUE(torch::equal(std::get<0>(expected), std::get<0>(per_head)));
  EXPECT_TRUE(torch::equal(std::get<1>(expected), std::get<1>(per_head)));
  // Causal: no weight on later positions (the last column is bias_k).
  auto w = std::get<1>(expected);
  EXPECT_EQ(w.narrow(-1, 0, L).masked_select(causal_bool(L, L)).abs().max().item<float>(), 0.0f);
  EXPECT_THROW(m->forward(x, x, x, {}, true, torch::zeros({3, L, L})), c10::Error);
}

TEST(Mha, VanillaCheckpointLoadsIntoItAndBack) {
  auto o = Options(16, 4).kdim(6).vdim(6).add_bias_kv(true);
  torch::manual_seed(1);
  torch::nn::MultiheadAttention vanilla(o);
  torch::manual_seed(99);  // different init, so loading must overwrite it
  shardplan::nn::MultiheadAttention ours(o);
  const std::string p1 = temp_path("mha_vanilla.pt"), p2 = temp_path("mha_ours.pt");
  torch::save(vanilla, p1);
  torch::load(ours, p1);
  auto q = torch::randn({4, 2, 16}), kv = torch::randn({5, 2, 6});
  EXPECT_TRUE(torch::equal(std::get<0>(vanilla->forward(q, kv, kv)), std::get<0>(ours->forward(q, kv, kv))));
  torch::manual_seed(5);
  torch::nn::MultiheadAttention back(o);
  torch::save(ours, p2);
  torch::load(back, p2);
  EXPECT_TRUE(torch::equal(std::get<0>(vanilla->forward(q, kv, kv)), std::get<0>(back->forward(q, kv, kv))));
  std::remove(p1.c_str());
  std::remove(p2.c_str());
}

TEST(Mha, WorksInAnyModuleWithDefaultArguments) {
  torch::nn::AnyModule any(shardplan::nn::MultiheadAttention(16, 4));
  auto x = torch::randn({3, 2, 16});
  auto r = any.forward<std::tuple<torch::Tensor, torch::Tensor>>(x, x, x);
  EXPECT_EQ(std::get<0>(r).sizes(), x.sizes());
  EXPECT_EQ(std::get<1>(r).sizes(), (std::vector<int64_t>{2, 3, 3}));
}

// ---------------------------------------------------------------- parity

enum class Inputs { Self, Cross, Distinct };  // q=k=v; k=v; three tensors
enum class Mask { None, CausalFloat, CausalBool, PerHead };

struct Config {
  std::string name;
  Options options = Options(16, 4);
  Inputs inputs = Inputs::Self;
  Mask mask = Mask::None;
  bool key_padding = false;
  bool need_weights = false;
  bool average = true;
  bool eval = false;
  std::string rules;
  std::map<std::string, std::pair<int64_t, int64_t>> splits;  // name -> (dim, blocks)
};

const int64_t kL = 5, kS = 6, kN = 3;

struct NetImpl : torch::nn::Cloneable<NetImpl> {
  explicit NetImpl(Options o) : options(std::move(o)) { reset(); }
  void reset() override { attn = register_module("attn", shardplan::nn::MultiheadAttention(options)); }
  Options options;
  shardplan::nn::MultiheadAttention attn{nullptr};
};

const char* kInProj =
    "  - {match: 'attn\\.in_proj_weight', layout: [model, null]}\n"
    "  - {match: 'attn\\.in_proj_bias', layout: [model]}\n";
const char* kOutRow = "  - {match: 'attn\\.out_proj\\.weight', layout: [null, model], input: sharded}\n";

std::map<std::string, std::pair<int64_t, int64_t>> in_proj_splits(bool out_row = true) {
  std::map<std::string, std::pair<int64_t, int64_t>> s = {{"attn.in_proj_weight", {0, 3}},
                                                          {"attn.in_proj_bias", {0, 3}}};
  if (out_row) s["attn.out_proj.weight"] = {1, 1};
  return s;
}

std::vector<Config> configs() {
  std::vector<Config> out;
  {
    Config c{"gpt_causal_float"};
    c.mask = Mask::CausalFloat;
    c.need_weights = true;
    c.rules = std::string(kInProj) + kOutRow;
    c.splits = in_proj_splits();
    out.push_back(c);
  }
  {
    Config c{"gpt_causal_bool"};
    c.mask = Mask::CausalBool;
    c.rules = std::string(kInProj) + kOutRow;
    c.splits = in_proj_splits();
    out.push_back(c);
  }
  {
    Config c{"cross_key_padding_per_head_weights"};
    c.inputs = Inputs::Cross;
    c.key_padding = true;
    c.need_weights = true;
    c.average = false;
    c.rules = std::string(kInProj) + kOutRow;
    c.splits = in_proj_splits();
    out.push_back(c);
  }
  {
    Config c{"kdim_vdim_bias_kv_inferred"};
    c.options = Options(16, 4).kdim(6).vdim(10).add_bias_kv(true);
    c.inputs = Inputs::Distinct;
    c.key_padding = true;
    c.mask = Mask::CausalFloat;
    c.need_weights = true;
    c.rules = std::string("  - {match: 'attn\\.[qkv]_proj_weight', layout: [model, null]}\n") + kOutRow;
    c.splits = {{"attn.q_proj_weight", {0, 1}}, {"attn.k_proj_weight", {0, 1}}, {"attn.v_proj_weight", {0, 1}},
                {"attn.in_proj_bias", {0, 3}},  {"attn.bias_k", {2, 1}},        {"attn.bias_v", {2, 1}},
                {"attn.out_proj.weight", {1, 1}}};
    out.push_back(c);
  }
  {
    Config c{"bias_kv_zero_attn_padding"};
    c.options = Options(16, 4).add_bias_kv(true).add_zero_attn(true);
    c.mask = Mask::CausalFloat;
    c.key_padding = true;
    c.need_weights = true;
    c.rules = std::string(kInProj) + "  - {match: 'attn\\.bias_[kv]', layout: [null, null, model]}\n" + kOutRow;
    c.splits = in_proj_splits();
    c.splits["attn.bias_k"] = {2, 1};
    c.splits["attn.bias_v"] = {2, 1};
    out.push_back(c);
  }
  {
    Config c{"no_bias_distinct"};
    c.options = Options(16, 4).bias(false);
    c.inputs = Inputs::Distinct;
    c.need_weights = true;
    c.average = false;
    c.rules = std::string("  - {match: 'attn\\.in_proj_weight', layout: [model, null], blocks: 3}\n") + kOutRow;
    c.splits = {{"attn.in_proj_weight", {0, 3}}, {"attn.out_proj.weight", {1, 1}}};
    out.push_back(c);
  }
  {
    Config c{"mask_3d_per_head_weights"};
    c.mask = Mask::PerHead;
    c.need_weights = true;
    c.average = false;
    c.rules = std::string(kInProj) + kOutRow;
    c.splits = in_proj_splits();
    out.push_back(c);
  }
  {
    // Heads split, out_proj left whole: the context is gathered for it.
    Config c{"out_proj_replicated"};
    c.mask = Mask::CausalFloat;
    c.rules = kInProj;
    c.splits = in_proj_splits(false);
    out.push_back(c);
  }
  {
    // out_proj row-parallel without `input: sharded`: gathered, then split.
    Config c{"out_proj_split_on_entry"};
    c.inputs = Inputs::Cross;
    c.rules = std::string(kInProj) + "  - {match: 'attn\\.out_proj\\.weight', layout: [null, model]}\n";
    c.splits = in_proj_splits();
    out.push_back(c);
  }
  {
    // Dropout does nothing in eval mode, sharded or not.
    Config c{"dropout_eval"};
    c.options = Options(16, 4).dropout(0.5);
    c.eval = true;
    c.mask = Mask::CausalBool;
    c.need_weights = true;
    c.rules = std::string(kInProj) + kOutRow;
    c.splits = in_proj_splits();
    out.push_back(c);
  }
  return out;
}

struct Case {
  int world;
  torch::Dtype dtype;
  bool adam;
  Config config;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.config.name << " world " << c.world; }

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return c.config.name + "_ws" + std::to_string(c.world) + (c.dtype == torch::kDouble ? "_f64" : "_f32") +
         (c.adam ? "_adam" : "_sgd");
}

std::vector<std::string> run_parity(const Case& c, const std::string& backend = "local") {
  const Config& cfg = c.config;
  torch::manual_seed(1234);
  auto reference = std::make_shared<NetImpl>(cfg.options);
  reference->to(c.dtype);
  if (cfg.eval) reference->eval();
  parity::Setup s;
  s.world = c.world;
  s.dtype = c.dtype;
  s.adam = c.adam;
  const int64_t E = cfg.options.embed_dim(), H = cfg.options.num_heads();
  const int64_t S = cfg.inputs == Inputs::Self ? kL : kS;
  // Inputs: query, [key], [value], [attn_mask], [key_padding_mask]. A float
  // mask is an input too, so its gradient is compared.
  for (int step = 0; step < s.steps; ++step) {
    std::vector<torch::Tensor> in = {torch::randn({kL, kN, E}, c.dtype)};
    if (cfg.inputs == Inputs::Cross) in.push_back(torch::randn({kS, kN, E}, c.dtype));
    if (cfg.inputs == Inputs::Distinct) {
      in.push_back(torch::randn({kS, kN, cfg.options.kdim()}, c.dtype));
      in.push_back(torch::randn({kS, kN, cfg.options.vdim()}, c.dtype));
    }
    if (cfg.mask == Mask::CausalFloat) in.push_back(causal_float(kL, S, c.dtype));
    if (cfg.mask == Mask::CausalBool) in.push_back(causal_bool(kL, S));
    if (cfg.mask == Mask::PerHead) in.push_back(torch::randn({kN * H, kL, S}, c.dtype));
    if (cfg.key_padding) {
      auto kpm = torch::zeros({kN, S}, torch::kBool);
      kpm[1][S - 1] = true;
      kpm[2][S - 2] = true;
      in.push_back(kpm);
    }
    s.inputs.push_back(in);
  }
  s.forward = [cfg](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
    auto& net = dynamic_cast<NetImpl&>(m);
    size_t i = 0;
    torch::Tensor q = in[i++], k = q, v = q, mask, kpm;
    if (cfg.inputs == Inputs::Cross) k = v = in[i++];
    if (cfg.inputs == Inputs::Distinct) {
      k = in[i++];
      v = in[i++];
    }
    if (cfg.mask != Mask::None) mask = in[i++];
    if (cfg.key_padding) kpm = in[i++];
    auto r = net.attn->forward(q, k, v, kpm, cfg.need_weights, mask, cfg.average);
    auto y = cfg.need_weights ? torch::cat({std::get<0>(r).flatten(), std::get<1>(r).flatten()}) : std::get<0>(r);
    // Scaled down: the harness's SGD (lr 0.1, momentum 0.9) on a weighted sum
    // of every output otherwise sharpens the softmax within 5 steps until the
    // rounding differences of sharded and unsharded sums grow ~1e5-fold.
    return y * 0.1;
  };
  const auto splits = cfg.splits;
  s.local = [splits](const std::string& name, const torch::Tensor& full, int rank, int world) {
    auto it = splits.find(name);
    return it == splits.end() ? full
                              : shardplan::shard_of(full, it->second.first, world, rank, it->second.second);
  };
  auto plan = shardplan::parse_plan("mesh: {model: auto}\nrules:\n" + cfg.rules, cfg.name + ".yaml");
  return parity::compare(reference, plan, s, backend);
}

class MhaParity : public ::testing::TestWithParam<Case> {};

TEST_P(MhaParity, MatchesUnshardedModel) {
  for (const auto& f : run_parity(GetParam())) ADD_FAILURE() << f;
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (const auto& config : configs())
    for (int world : {1, 2, 4})
      for (auto dtype : {torch::kDouble, torch::kFloat}) out.push_back({world, dtype, false, config});
  // Adam's state is elementwise, so shards must follow it exactly too. Not
  // on plain biased attention: there the key bias has no effect (softmax is
  // shift-invariant), its true gradient is 0, and Adam scales the rounding
  // noise that stands in for it up to lr * noise / eps, which differs between
  // any two summation orders. bias_k or the zero attention give it a real
  // gradient.
  for (const auto& config : configs())
    if (config.name == "no_bias_distinct" || config.name == "kdim_vdim_bias_kv_inferred" ||
        config.name == "bias_kv_zero_attn_padding")
      for (int world : {2, 4})
        for (auto dtype : {torch::kDouble, torch::kFloat}) out.push_back({world, dtype, true, config});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Mha, MhaParity, ::testing::ValuesIn(all_cases()), case_name);

// The same collectives over TCP: the GPT case and the per-head gather.
TEST(MhaParallel, GlooBackendMatchesUnshardedModel) {
  for (const auto& config : configs())
    if (config.name == "gpt_causal_float" || config.name == "mask_3d_per_head_weights")
      for (const auto& f : run_parity({2, torch::kDouble, false, config}, "gloo")) ADD_FAILURE() << f;
}

// ---------------------------------------------------------------- dropout

// Attention dropout inside a head-sharded region draws an independent mask
// on each rank: with every head identical, a rank's first head (global head
// 0 on rank 0, head 2 on rank 1) sees the same scores on both ranks, so only
// the masks can tell them apart. The output is still one tensor on all ranks.
TEST(MhaParallel, DropoutMasksAreIndependentPerRank) {
  torch::manual_seed(8);
  auto reference = std::make_shared<NetImpl>(Options(16, 4).dropout(0.5));
  {
    torch::NoGradGuard no_grad;
    auto w = reference->attn->in_proj_weight.view({3, 4, 4, 16});
    w.copy_(w.narrow(1, 0, 1).expand({3, 4, 4, 16}).clone());
  }
  auto plan = shardplan::parse_plan(std::string("mesh: {model: auto}\nrules:\n") + kInProj + kOutRow);
  std::vector<std::shared_ptr<NetImpl>> replicas;
  for (int r = 0; r < 2; ++r) replicas.push_back(std::dynamic_pointer_cast<NetImpl>(reference->clone()));
  auto x = torch::randn({6, 2, 16});
  std::vector<torch::Tensor> outs(2), weights(2);
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& world) {
    auto& m = *replicas[world.rank()];
    shardplan::parallelize(m, plan, world);
    auto r = m.attn->forward(x, x, x, {}, true, {}, false);
    outs[world.rank()] = std::get<0>(r).detach();
    weights[world.rank()] = std::get<1>(r).detach();
  });
  EXPECT_TRUE(torch::allclose(outs[0], outs[1]));
  EXPECT_TRUE(torch::equal(weights[0], weights[1]));
  auto dropped = weights[0] == 0;  // [N, H, L, S]
  EXPECT_GT(dropped.sum().item<int64_t>(), 0);
  EXPECT_FALSE(torch::equal(dropped.select(1, 0), dropped.select(1, 2)));
  EXPECT_FALSE(torch::equal(dropped.select(1, 1), dropped.select(1, 3)));
}

TEST(MhaParallel, PrintsItsStrategy) {
  torch::manual_seed(2);
  auto reference = std::make_shared<NetImpl>(Options(16, 4));
  auto plan = shardplan::parse_plan(std::string("mesh: {model: auto}\nrules:\n") + kInProj + kOutRow);
  std::vector<std::shared_ptr<NetImpl>> replicas;
  for (int r = 0; r < 2; ++r) replicas.push_back(std::dynamic_pointer_cast<NetImpl>(reference->clone()));
  std::vector<std::string> printed(2);
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& world) {
    auto& m = *replicas[world.rank()];
    shardplan::parallelize(m, plan, world);
    std::ostringstream os;
    m.attn->pretty_print(os);
    printed[world.rank()] = os.str();
  });
  EXPECT_EQ(printed[0], "shardplan::nn::MultiheadAttention(head-parallel over 'model' (2): 2 of 4 heads per rank)");
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

TEST(MhaPlan, HeadsNotDivisibleByTheAxisNameTheParameter) {
  NetImpl m(Options(24, 6));
  auto msg = check_error(m, "  - {match: 'attn\\.in_proj_weight', layout: [model, null]}\n", 4);
  EXPECT_HAS(msg, "bad.yaml:3:");
  EXPECT_HAS(msg, "'attn.in_proj_weight'");
  EXPECT_HAS(msg, "num_heads 6 is not divisible by mesh axis 'model' of size 4");
  NetImpl separate(Options(24, 6).kdim(8).vdim(8));
  auto msg2 = check_error(separate, "  - {match: 'attn\\.[qkv]_proj_weight', layout: [model, null]}\n", 4);
  EXPECT_HAS(msg2, "'attn.q_proj_weight'");
  EXPECT_HAS(msg2, "num_heads 6 is not divisible");
  EXPECT_EQ(check_error(m, "  - {match: 'attn\\.in_proj_weight', layout: [model, null]}\n", 3), "");
}

TEST(MhaPlan, MisplacedLayoutsAndOptionsAreRejected) {
  NetImpl m(Options(16, 4).add_bias_kv(true));
  EXPECT_HAS(check_error(m, "  - {match: 'attn\\.in_proj_weight', layout: [null, model]}\n"),
             "its input features cannot be split");
  EXPECT_HAS(check_error(m,
                         "  - {match: 'attn\\.in_proj_weight', layout: [model, null]}\n"
                         "  - {match: 'attn\\.in_proj_bias', layout: [null]}\n"),
             "in_proj_bias must follow the heads: layout [model]");
  EXPECT_HAS(check_error(m,
                         "  - {match: 'attn\\.in_proj_weight', layout: [model, null]}\n"
                         "  - {match: 'attn\\.bias_k', layout: [model, null, null]}\n"),
             "bias_k must follow the heads: layout [null, null, model]");
  EXPECT_HAS(check_error(m, "  - {match: 'attn\\.in_proj_bias', layout: [model]}\n"),
             "cannot be split while the attention heads are not");
  auto output = check_error(m, "  - {match: 'attn\\.in_proj_weight', layout: [model, null], output: sharded}\n");
  EXPECT_HAS(output, "bad.yaml:3:");
  EXPECT_HAS(output, "option 'output'");
  EXPECT_HAS(check_error(m, "  - {match: 'attn\\.in_proj_weight', layout: [model, null], input: sharded}\n"),
             "option 'input'");
  EXPECT_HAS(check_error(m, "  - {match: 'attn\\.in_proj_weight', layout: [model, null], blocks: 2}\n"),
             "option 'blocks'");
  NetImpl separate(Options(16, 4).kdim(8).vdim(8));
  EXPECT_HAS(check_error(separate, "  - {match: 'attn\\.q_proj_weight', layout: [model, null]}\n"),
             "k_proj_weight needs the layout [model, null] too");
}

TEST(MhaPlan, VanillaTorchAttentionIsRejectedNamingTheTypeToUse) {
  struct VanillaImpl : torch::nn::Module {
    VanillaImpl() { a = register_module("a", torch::nn::MultiheadAttention(16, 4)); }
    torch::nn::MultiheadAttention a{nullptr};
  } m;
  auto msg = check_error(m, "  - {match: 'a\\.in_proj_weight', layout: [model, null]}\n");
  EXPECT_HAS(msg, "torch::nn::MultiheadAttentionImpl");
  EXPECT_HAS(msg, "shardplan::nn::MultiheadAttention");
}

TEST(MhaPlan, ReportGivesLocalShapes) {
  NetImpl m(Options(16, 4).add_bias_kv(true));
  auto plan = shardplan::parse_plan(std::string("mesh: {model: auto}\nrules:\n") + kInProj + kOutRow);
  auto report = shardplan::check_plan(m, plan, 4);
  std::map<std::string, shardplan::ReportRow> rows;
  for (const auto& r : report.rows) rows[r.path] = r;
  EXPECT_EQ(rows["attn.in_proj_weight"].local_shape, (std::vector<int64_t>{12, 16}));
  EXPECT_EQ(rows["attn.in_proj_weight"].plugin, "mha");
  EXPECT_HAS(rows["attn.in_proj_weight"].note, "1 of 4 heads");
  EXPECT_EQ(rows["attn.in_proj_bias"].local_shape, (std::vector<int64_t>{12}));
  EXPECT_EQ(rows["attn.bias_k"].local_shape, (std::vector<int64_t>{1, 1, 4}));
  EXPECT_HAS(rows["attn.bias_k"].note, "follows the heads");
  EXPECT_EQ(rows["attn.out_proj.weight"].local_shape, (std::vector<int64_t>{16, 4}));
  EXPECT_EQ(rows["attn.out_proj.weight"].plugin, "dense");
  EXPECT_EQ(rows["attn.out_proj.bias"].local_shape, (std::vector<int64_t>{16}));
}

// out_proj told its input arrives split while the heads are whole would
// multiply mismatched shapes; it is a clear error at the first forward.
TEST(MhaPlan, ShardedOutProjInputWithoutSplitHeadsIsAnError) {
  torch::manual_seed(3);
  auto reference = std::make_shared<NetImpl>(Options(16, 4));
  auto plan = shardplan::parse_plan(std::string("mesh: {model: auto}\nrules:\n") + kOutRow);
  std::vector<std::shared_ptr<NetImpl>> replicas;
  for (int r = 0; r < 2; ++r) replicas.push_back(std::dynamic_pointer_cast<NetImpl>(reference->clone()));
  auto x = torch::randn({3, 2, 16});
  std::vector<std::string> errors(2);
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& world) {
    auto& m = *replicas[world.rank()];
    shardplan::parallelize(m, plan, world);
    try {
      m.attn->forward(x, x, x);
    } catch (const shardplan::Error& e) {
      errors[world.rank()] = e.what();
    }
  });
  for (const auto& e : errors) EXPECT_HAS(e, "the attention heads are not split");
}

}  // namespace

}  // namespace test_mha
