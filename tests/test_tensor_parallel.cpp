// shardplan::TensorParallel, the in-process wrapper, against the same model
// unsharded: forward output, input gradient and parameters (gathered by
// state_dict()) through five steps of a standard torch::optim optimizer on
// tp->parameters(), at 1, 2 and 4 "cpu" devices; checkpoints that load into
// the plain model and back; a failing replica surfacing in the caller.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <set>
#include <stdexcept>

#include "shardplan/error.h"
#include "shardplan/nn/conv.h"
#include "shardplan/nn/cross_entropy.h"
#include "shardplan/nn/embedding.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/tensor_parallel.h"
#include "shardplan/tied.h"
#include "parity.h"

namespace test_tensor_parallel {

namespace {

using shardplan::nn::Linear;

// The model plans/mlp.yaml is written for: fc1 -> relu -> fc2 -> relu -> fc3.
struct MLPImpl : torch::nn::Cloneable<MLPImpl> {
  MLPImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", Linear(8, 16));
    fc2 = register_module("fc2", Linear(16, 12));
    fc3 = register_module("fc3", Linear(12, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3->forward(torch::relu(fc2->forward(torch::relu(fc1->forward(x)))));
  }
  Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(MLP);

shardplan::Plan mlp_plan() { return shardplan::load_plan(SHARDPLAN_SOURCE_DIR "/plans/mlp.yaml"); }

std::vector<std::string> cpus(int n) { return std::vector<std::string>(n, "cpu"); }

std::unique_ptr<torch::optim::Optimizer> optimizer(std::vector<torch::Tensor> params, bool adam) {
  if (adam) return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
}

// A loss every output element contributes to differently.
torch::Tensor loss_of(const torch::Tensor& y) {
  return (y * torch::linspace(0.5, 1.5, y.numel(), y.options()).view(y.sizes())).sum();
}

struct Case {
  int world;
  torch::Dtype dtype;
  bool adam;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "ws" + std::to_string(c.world) + (c.dtype == torch::kDouble ? "_f64" : "_f32") +
         (c.adam ? "_adam" : "_sgd");
}

class TensorParallelParity : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelParity, TrainsLikeTheUnshardedModel) {
  const Case& c = GetParam();
  const double tol = parity::tolerance(c.dtype);
  torch::manual_seed(1234);
  auto reference = std::make_shared<MLPImpl>();
  reference->to(c.dtype);
  auto copy = std::dynamic_pointer_cast<MLPImpl>(reference->clone());
  std::vector<torch::Tensor> inputs;
  for (int step = 0; step < 5; ++step) inputs.push_back(torch::randn({5, 8}, c.dtype));

  shardplan::TensorParallel tp(copy, mlp_plan(), cpus(c.world));
  int64_t numel = 0;
  for (const auto& p : tp->parameters()) numel += p.numel();
  int64_t ref_numel = 0;
  for (const auto& p : reference->parameters()) ref_numel += p.numel();
  EXPECT_EQ(numel, ref_numel) << "every element exposed to the optimizer exactly once";

  auto ref_opt = optimizer(reference->parameters(), c.adam);
  auto tp_opt = optimizer(tp->parameters(), c.adam);
  for (int step = 0; step < 5; ++step) {
    auto x_ref = inputs[step].clone().requires_grad_(true);
    auto x_tp = inputs[step].clone().requires_grad_(true);
    ref_opt->zero_grad();
    tp_opt->zero_grad();
    auto y_ref = reference->forward(x_ref);
    auto y_tp = tp->forward(x_tp);
    loss_of(y_ref).backward();
    loss_of(y_tp).backward();
    EXPECT_LE(parity::rel_err(y_tp, y_ref), tol) << "output, step " << step;
    ASSERT_TRUE(x_tp.grad().defined()) << "step " << step;
    EXPECT_LE(parity::rel_err(x_tp.grad(), x_ref.grad()), tol) << "input grad, step " << step;
    ref_opt->step();
    tp_opt->step();
  }
  auto state = tp->state_dict();
  auto ref_params = reference->named_parameters();
  ASSERT_EQ(state.size(), ref_params.size());
  for (const auto& kv : ref_params) {
    ASSERT_TRUE(state.contains(kv.key())) << kv.key();
    EXPECT_LE(parity::rel_err(state[kv.key()], kv.value()), tol) << kv.key();
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (int world : {1, 2, 4})
    for (auto dtype : {torch::kDouble, torch::kFloat})
      for (bool adam : {false, true}) out.push_back({world, dtype, adam});
  return out;
}

INSTANTIATE_TEST_SUITE_P(TensorParallel, TensorParallelParity, ::testing::ValuesIn(all_cases()), case_name);

TEST(TensorParallel, ExposesEachShardOnceAndReplicatedParametersOnce) {
  torch::manual_seed(1);
  MLP model;
  shardplan::TensorParallel tp(model, mlp_plan(), {"cpu", "cpu"});
  std::set<std::string> names;
  for (const auto& p : tp->named_parameters()) names.insert(p.key());
  const std::set<std::string> expected = {"rank0.fc1.weight", "rank0.fc1.bias",  "rank0.fc2.weight",
                                          "rank0.fc2.bias",   "rank0.fc3.weight", "rank0.fc3.bias",
                                          "rank1.fc1.weight", "rank1.fc1.bias",  "rank1.fc2.weight"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(tp->named_parameters()["rank1.fc1.weight"].sizes(), (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(tp->named_parameters()["rank1.fc2.weight"].sizes(), (std::vector<int64_t>{12, 8}));
  EXPECT_EQ(tp->world_size(), 2);
  EXPECT_NE(tp->report(1).table().find("fc1.weight"), std::string::npos);
}

TEST(TensorParallel, NoGradForwardBuildsNoGraph) {
  torch::manual_seed(2);
  auto model = std::make_shared<MLPImpl>();
  model->to(torch::kDouble);
  shardplan::TensorParallel tp(std::dynamic_pointer_cast<MLPImpl>(model->clone()), mlp_plan(), cpus(2));
  auto x = torch::randn({3, 8}, torch::kDouble);
  torch::NoGradGuard no_grad;
  auto y = tp->forward(x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_LE(parity::rel_err(y, model->forward(x)), 1e-12);
}

TEST(TensorParallel, RetainedGraphBacksTwice) {
  torch::manual_seed(9);
  auto model = std::make_shared<MLPImpl>();
  model->to(torch::kDouble);
  shardplan::TensorParallel tp(std::dynamic_pointer_cast<MLPImpl>(model->clone()), mlp_plan(), cpus(2));
  auto x = torch::randn({3, 8}, torch::kDouble);
  auto x_ref = x.clone().requires_grad_(true), x_tp = x.clone().requires_grad_(true);
  auto l_ref = loss_of(model->forward(x_ref)), l_tp = loss_of(tp->forward(x_tp));
  l_ref.backward({}, /*retain_graph=*/true);
  l_ref.backward();
  l_tp.backward({}, /*retain_graph=*/true);
  l_tp.backward();
  EXPECT_LE(parity::rel_err(x_tp.grad(), x_ref.grad()), 1e-12);
  EXPECT_LE(parity::rel_err(tp->named_parameters()["rank0.fc3.weight"].grad(), model->fc3->weight.grad()), 1e-12);
}

// The replicas' graphs live as long as the caller's: freed by a backward
// without retain_graph, or when the caller drops an output it never backs.
TEST(TensorParallel, ReplicaGraphsAreFreedWithTheCallersGraph) {
  torch::manual_seed(10);
  using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  std::mutex mu;
  std::vector<WeakTensor> outputs;
  auto watched = [&](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
    auto y = dynamic_cast<MLPImpl&>(m).forward(in[0]);
    std::lock_guard<std::mutex> lock(mu);
    outputs.emplace_back(y.getIntrusivePtr());
    return y;
  };
  shardplan::TensorParallel tp(std::make_shared<MLPImpl>(), mlp_plan(), cpus(2), watched);
  auto all_expired = [&] {
    for (auto& w : outputs)
      if (!w.expired()) return false;
    return true;
  };
  auto y = tp->forward(torch::randn({3, 8}));
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_FALSE(all_expired());
  loss_of(y).backward();
  EXPECT_TRUE(all_expired()) << "freed by the backward, while the caller still holds the output";
  outputs.clear();
  {
    auto dropped = tp->forward(torch::randn({3, 8}));
    EXPECT_FALSE(all_expired());
  }
  EXPECT_TRUE(all_expired()) << "freed with an output that was never backed";
}

TEST(TensorParallel, TrainAndEvalReachEveryReplica) {
  shardplan::TensorParallel tp(std::make_shared<MLPImpl>(), mlp_plan(), cpus(2));
  tp->eval();
  EXPECT_FALSE(tp->replica(0)->is_training());
  EXPECT_FALSE(tp->replica(1)->is_training());
  tp->train();
  EXPECT_TRUE(tp->replica(1)->is_training());
  EXPECT_THROW(tp->to(torch::kDouble), shardplan::Error);
}

// ---------------------------------------------------------------- gathering

// Shards that are not one even block each: a vocab of 10 over 4 ranks
// (3, 3, 3, 1 rows) and a fused Linear split per block (`blocks: 3`), whose
// shards interleave in the full tensor.
struct EmbedNetImpl : torch::nn::Cloneable<EmbedNetImpl> {
  EmbedNetImpl() { reset(); }
  void reset() override {
    emb = register_module("emb", shardplan::nn::Embedding(10, 6));
    qkv = register_module("qkv", Linear(6, 12));
  }
  torch::Tensor forward(const torch::Tensor& ids) { return qkv->forward(emb->forward(ids)); }
  shardplan::nn::Embedding emb{nullptr};
  Linear qkv{nullptr};
};

const char* kUnevenBlockedPlan =
    "mesh: {model: auto}\n"
    "rules:\n"
    "  - {match: 'emb\\.weight', layout: [model, null]}\n"
    "  - {match: 'qkv\\.weight', layout: [model, null], blocks: 3}\n";

TEST(TensorParallel, StateDictUnblocksAndJoinsUnevenShards) {
  for (int world : {2, 4}) {
    torch::manual_seed(3);
    auto reference = std::make_shared<EmbedNetImpl>();
    reference->to(torch::kDouble);
    auto copy = std::dynamic_pointer_cast<EmbedNetImpl>(reference->clone());
    shardplan::TensorParallel tp(copy, shardplan::parse_plan(kUnevenBlockedPlan, "uneven.yaml"), cpus(world));
    for (const auto& kv : reference->named_parameters())
      EXPECT_TRUE(torch::equal(tp->state_dict()[kv.key()], kv.value())) << kv.key() << " world " << world;

    // Training, with integer inputs: the output needs grad only through the
    // replicas' parameters.
    torch::optim::SGD ref_opt(reference->parameters(), 0.1), tp_opt(tp->parameters(), 0.1);
    for (int step = 0; step < 5; ++step) {
      auto ids = torch::randint(0, 10, {4, 3}, torch::kLong);
      ref_opt.zero_grad();
      tp_opt.zero_grad();
      auto y_ref = reference->forward(ids);
      auto y_tp = tp->forward(ids);
      ASSERT_TRUE(y_tp.requires_grad());
      loss_of(y_ref).backward();
      loss_of(y_tp).backward();
      EXPECT_LE(parity::rel_err(y_tp, y_ref), 1e-12) << "world " << world << " step " << step;
      ref_opt.step();
      tp_opt.step();
    }
    for (const auto& kv : reference->named_parameters())
      EXPECT_LE(parity::rel_err(tp->state_dict()[kv.key()], kv.value()), 1e-12) << kv.key() << " world " << world;
  }
}

// A tied embedding / LM head, vocab-parallel on both, into the vocab-parallel
// loss: two tensor inputs, a scalar output, one tensor under two names.
struct TiedLMImpl : torch::nn::Cloneable<TiedLMImpl> {
  TiedLMImpl() { reset(); }
  void reset() override {
    emb = register_module("emb", shardplan::nn::Embedding(16, 8));
    head = register_module("head", Linear(torch::nn::LinearOptions(8, 16).bias(false)));
    loss = register_module("loss", shardplan::nn::CrossEntropyLoss());
    tie();
  }
  void tie() { head->weight = shardplan::tie_parameter(*head, "weight", emb->weight); }
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& device = c10::nullopt) const override {
    auto copy = torch::nn::Cloneable<TiedLMImpl>::clone(device);
    std::dynamic_pointer_cast<TiedLMImpl>(copy)->tie();
    return copy;
  }
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& targets) {
    auto logits = head(torch::tanh(emb(ids)));
    return loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  }
  shardplan::nn::Embedding emb{nullptr};
  Linear head{nullptr};
  shardplan::nn::CrossEntropyLoss loss{nullptr};
};

TEST(TensorParallel, TiedWeightsAreExposedOnceAndSavedUnderBothNames) {
  const char* plan =
      "mesh: {model: auto}\n"
      "rules:\n"
      "  - {match: 'emb\\.weight', layout: [model, null]}\n"
      "  - {match: 'head\\.weight', layout: [model, null], output: sharded}\n"
      "  - {match: 'loss', layout: [null, model]}\n";
  for (int world : {2, 4}) {
    torch::manual_seed(12);
    auto reference = std::make_shared<TiedLMImpl>();
    reference->to(torch::kDouble);
    shardplan::TensorParallel tp(std::dynamic_pointer_cast<TiedLMImpl>(reference->clone()),
                                 shardplan::parse_plan(plan, "tied.yaml"), cpus(world));
    int64_t numel = 0;
    for (const auto& p : tp->parameters()) numel += p.numel();
    EXPECT_EQ(numel, 16 * 8) << "the tied tensor once";
    torch::optim::SGD ref_opt(shardplan::unique_parameters(*reference), 0.1), tp_opt(tp->parameters(), 0.1);
    for (int step = 0; step < 5; ++step) {
      auto ids = torch::randint(0, 16, {3, 4}, torch::kLong), targets = torch::randint(0, 16, {3, 4}, torch::kLong);
      ref_opt.zero_grad();
      tp_opt.zero_grad();
      auto l_ref = reference->forward(ids, targets);
      auto l_tp = tp->forward(ids, targets);
      l_ref.backward();
      l_tp.backward();
      EXPECT_LE(parity::rel_err(l_tp, l_ref), 1e-12) << "world " << world << " step " << step;
      ref_opt.step();
      tp_opt.step();
    }
    auto state = tp->state_dict();
    EXPECT_LE(parity::rel_err(state["emb.weight"], reference->emb->weight), 1e-12) << "world " << world;
    EXPECT_TRUE(torch::equal(state["head.weight"], state["emb.weight"])) << "world " << world;
  }
}

// ---------------------------------------------------------------- checkpoints

std::string temp_path(const std::string& name) {
  return "/tmp/shardplan_tp_" + std::to_string(::getpid()) + "_" + name + ".pt";
}

TEST(TensorParallel, SaveLoadsIntoThePlainModelAndBack) {
  torch::manual_seed(4);
  auto model = std::make_shared<MLPImpl>();
  shardplan::TensorParallel tp(model, mlp_plan(), cpus(2));
  {  // move the values away from the initial ones
    torch::optim::SGD opt(tp->parameters(), 0.1);
    loss_of(tp->forward(torch::randn({3, 8}))).backward();
    opt.step();
  }
  const auto path = temp_path("save");
  torch::save(tp, path);
  torch::manual_seed(99);
  auto plain = std::make_shared<MLPImpl>();
  torch::load(plain, path);
  auto state = tp->state_dict();
  for (const auto& kv : plain->named_parameters())
    EXPECT_TRUE(torch::equal(kv.value(), state[kv.key()])) << kv.key();

  // A plain model's checkpoint into the wrapper: every shard follows.
  torch::manual_seed(5);
  auto other = std::make_shared<MLPImpl>();
  torch::save(other, path);
  torch::load(tp, path);
  for (const auto& kv : other->named_parameters())
    EXPECT_TRUE(torch::equal(tp->state_dict()[kv.key()], kv.value())) << kv.key();
  auto x = torch::randn({3, 8});
  EXPECT_LE(parity::rel_err(tp->forward(x), other->forward(x)), 1e-5);
  std::remove(path.c_str());
}

TEST(TensorParallel, LoadStateDictRejectsMissingAndMisshapenEntries) {
  torch::manual_seed(6);
  shardplan::TensorParallel tp(std::make_shared<MLPImpl>(), mlp_plan(), cpus(2));
  auto state = tp->state_dict();
  auto missing = state;
  missing.erase("fc2.bias");
  try {
    tp->load_state_dict(missing);
    ADD_FAILURE() << "no error";
  } catch (const shardplan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing entry 'fc2.bias'"), std::string::npos) << e.what();
  }
  auto bad = state;
  bad["fc1.weight"] = torch::zeros({16, 9});
  try {
    tp->load_state_dict(bad);
    ADD_FAILURE() << "no error";
  } catch (const shardplan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fc1.weight' has shape [16, 9]"), std::string::npos) << e.what();
  }
  auto extra = state;
  extra.insert("fc4.weight", torch::zeros({1}));
  EXPECT_THROW(tp->load_state_dict(extra), shardplan::Error);
  // Nothing was written by the failed loads.
  for (const auto& kv : state) EXPECT_TRUE(torch::equal(tp->state_dict()[kv.key()], kv.value())) << kv.key();
}

// ---------------------------------------------------------------- failures

TEST(TensorParallel, ErrorInOneReplicaSurfacesInTheCaller) {
  for (int bad_rank : {0, 1}) {
    torch::manual_seed(7);
    auto model = std::make_shared<MLPImpl>();
    {
      // fc1 is column-parallel: rows 0..7 on rank 0, 8..15 on rank 1.
      torch::NoGradGuard no_grad;
      model->fc1->weight[bad_rank * 8 + 3][0] = 1234;
    }
    auto poisoned = [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
      auto& mlp = dynamic_cast<MLPImpl&>(m);
      if ((mlp.fc1->weight.select(1, 0) == 1234).any().item<bool>()) throw std::runtime_error("poisoned replica");
      return mlp.forward(in[0]);
    };
    shardplan::TensorParallel tp(model, mlp_plan(), cpus(2), poisoned);
    try {
      tp->forward(torch::randn({3, 8}));
      ADD_FAILURE() << "no error";
    } catch (const shardplan::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("rank " + std::to_string(bad_rank) + ": poisoned replica"), std::string::npos) << msg;
    }
    try {
      tp->forward(torch::randn({3, 8}));
      ADD_FAILURE() << "no error";
    } catch (const shardplan::Error& e) {
      EXPECT_NE(std::string(e.what()).find("unusable after an earlier failure"), std::string::npos) << e.what();
    }
  }
}

TEST(TensorParallel, ErrorInOneReplicasBackwardSurfacesInTheCaller) {
  torch::manual_seed(11);
  auto model = std::make_shared<MLPImpl>();
  {
    torch::NoGradGuard no_grad;
    model->fc1->weight[8 + 3][0] = 1234;  // a row of rank 1's shard
  }
  auto poisoned = [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
    auto& mlp = dynamic_cast<MLPImpl&>(m);
    auto y = mlp.forward(in[0]);
    if ((mlp.fc1->weight.select(1, 0) == 1234).any().item<bool>())
      y.register_hook([](torch::Tensor) -> torch::Tensor { throw std::runtime_error("poisoned backward"); });
    return y;
  };
  shardplan::TensorParallel tp(model, mlp_plan(), cpus(2), poisoned);
  auto x = torch::randn({3, 8}).requires_grad_(true);
  auto loss = loss_of(tp->forward(x));
  try {
    loss.backward();
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1: poisoned backward"), std::string::npos) << e.what();
  }
}

std::string construct_error(const std::vector<std::string>& devices) {
  try {
    shardplan::TensorParallel tp(std::make_shared<MLPImpl>(), mlp_plan(), devices);
  } catch (const shardplan::Error& e) {
    return e.what();
  }
  return "";
}

TEST(TensorParallel, RejectsBadDevices) {
  auto cuda = construct_error({"cpu", "cuda:0"});
  EXPECT_NE(cuda.find("device 'cuda:0' is not supported"), std::string::npos) << cuda;
  auto junk = construct_error({"tpu"});
  EXPECT_NE(junk.find("device 'tpu' is not a device"), std::string::npos) << junk;
  auto none = construct_error({});
  EXPECT_NE(none.find("no devices given"), std::string::npos) << none;
}

struct NotCloneableImpl : torch::nn::Module {
  NotCloneableImpl() { fc1 = register_module("fc1", Linear(8, 16)); }
  torch::Tensor forward(const torch::Tensor& x) { return fc1->forward(x); }
  Linear fc1{nullptr};
};

TEST(TensorParallel, RejectsModelsThatCannotBeCloned) {
  try {
    shardplan::TensorParallel tp(std::make_shared<NotCloneableImpl>(), mlp_plan(), cpus(2));
    ADD_FAILURE() << "no error";
  } catch (const shardplan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be cloneable"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("torch::nn::Cloneable<"), std::string::npos) << e.what();
  }
}

TEST(TensorParallel, PlanErrorsNameTheRank) {
  torch::manual_seed(8);
  // 16 hidden features do not split over 3 ranks.
  try {
    shardplan::TensorParallel tp(std::make_shared<MLPImpl>(), mlp_plan(), cpus(3));
    ADD_FAILURE() << "no error";
  } catch (const shardplan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("TensorParallel: rank "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fc1.weight"), std::string::npos) << e.what();
  }
}

// A bias no rule places follows its column-parallel weight: the report says
// so with the layout and split it really has (it said [null] of a [8]-of-[16]
// shard), in its row and in the table.
TEST(TensorParallel, ReportShowsTheSplitOfABiasThatFollowsItsWeight) {
  torch::manual_seed(9);
  const auto plan = shardplan::parse_plan("mesh: {model: auto}\nrules:\n  - {match: 'fc1\\.weight', layout: [model, null]}\n",
                                          "bias.yaml");
  shardplan::TensorParallel tp(std::make_shared<MLPImpl>(), plan, cpus(2));
  const shardplan::ParallelReport& report = tp->report(1);
  const shardplan::ReportRow& bias = report.rows.at(1);
  ASSERT_EQ(bias.path, "fc1.bias");
  EXPECT_EQ(bias.layout, "[model]");
  EXPECT_EQ(bias.rule, "");
  EXPECT_EQ(bias.note, "column-parallel, follows weight");
  EXPECT_EQ(bias.global_shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(bias.local_shape, (std::vector<int64_t>{8}));
  ASSERT_EQ(bias.splits.size(), 1u);
  EXPECT_EQ(bias.splits[0].dim, 0);
  EXPECT_EQ(bias.splits[0].axis, "model");
  EXPECT_EQ(bias.splits[0].parts, 2);
  EXPECT_EQ(bias.splits[0].index, 1);
  EXPECT_EQ(bias.splits[0].blocks, 1);
  EXPECT_NE(report.table().find("\nfc1.bias    [model]         [16]          [8]           dense   "
                                "column-parallel, follows weight\n"),
            std::string::npos)
      << report.table();
  // What no plugin splits keeps the layout of an unmatched parameter.
  EXPECT_EQ(report.rows.at(3).path, "fc2.bias");
  EXPECT_EQ(report.rows.at(3).layout, "[null]");
  EXPECT_TRUE(report.rows.at(3).splits.empty());
}

struct ConvNetImpl : torch::nn::Cloneable<ConvNetImpl> {
  ConvNetImpl() { reset(); }
  void reset() override { conv = register_module("conv", shardplan::nn::Conv2d(16, 32, 3)); }
  shardplan::nn::Conv2d conv{nullptr};
};

// A 4-D layout and 4-D shapes are wider than the columns' usual width: the
// columns widen, two spaces apart ("[model, null, null, null][32, 16, 3, 3]"
// ran together before).
TEST(TensorParallel, ReportTableKeepsWideColumnsApart) {
  auto model = std::make_shared<ConvNetImpl>();
  const auto plan = shardplan::parse_plan(
      "mesh: {model: auto}\nrules:\n  - {match: 'conv\\.weight', layout: [model, null, null, null]}\n", "conv.yaml");
  const std::string want =
      "mesh {model: 2}, rank 0 of 2\n"
      "parameter    layout                     global          local           plugin  rule / note\n"
      "conv.weight  [model, null, null, null]  [32, 16, 3, 3]  [16, 16, 3, 3]  conv    "
      "conv.yaml:3:5 output-channel parallel, output gathered\n"
      "conv.bias    [model]                    [32]            [16]            conv    "
      "output-channel parallel, follows weight\n"
      "parameter bytes on this rank: 9280 of 18560\n";
  EXPECT_EQ(shardplan::check_plan(*model, plan, 2, 0).table(), want);
}

}  // namespace

}  // namespace test_tensor_parallel
