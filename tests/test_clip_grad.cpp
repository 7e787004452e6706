// shardplan::clip_grad_norm_ on models sharded by parallelize and in the
// in-process wrapper, against torch::nn::utils::clip_grad_norm_ on the same
// model unsharded in one process: the norm of every step (each element of
// the unsharded model counted once: shards, replicas, shared kv heads,
// sequence-parallel norms) and the parameters after several SGD steps that
// clip at every step, float64 to 1e-12 (the Llama's 1e-10, as its parity
// tests), float32 looser; norm types 2, 1, 3 and inf; a NaN on one rank;
// bad input. (DataParallel, ZeRO-1, TorchScript and the replica check:
// test_clip_grad_dp.cpp.)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "llama_fixture.h"
#include "models/gpt.h"
#include "models/model.h"
#include "parity.h"
#include "shardplan/checkpoint.h"
#include "shardplan/clip_grad.h"
#include "shardplan/error.h"
#include "shardplan/nn/cross_entropy.h"
#include "shardplan/nn/embedding.h"
#include "shardplan/nn/layer_norm.h"
#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/replicas.h"
#include "shardplan/plan.h"
#include "shardplan/tensor_parallel.h"
#include "shardplan/tied.h"
#include "shardplan/world.h"

namespace test_clip_grad {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
namespace ex = shardplan::examples;
using shardplan::World;

// The model: the README's plan (plans/mlp.yaml: fc1 column, fc2 row)
// with a replicated LayerNorm after fc2.
struct ReadmeMlpImpl : torch::nn::Cloneable<ReadmeMlpImpl> {
  ReadmeMlpImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", shardplan::nn::Linear(6, 8));
    fc2 = register_module("fc2", shardplan::nn::Linear(8, 6));
    ln = register_module("ln", shardplan::nn::LayerNorm(std::vector<int64_t>{6}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return ln(fc2(torch::relu(fc1(x)))); }
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr};
  shardplan::nn::LayerNorm ln{nullptr};
};
TORCH_MODULE(ReadmeMlp);

shardplan::Plan plan_file(const std::string& name) {
  return shardplan::load_plan(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/" + name + ".yaml");
}

// A model, the loss of step s, and how to clip.
struct Case {
  std::shared_ptr<torch::nn::Module> model;  // unsharded, initialised
  shardplan::Plan plan;
  std::function<torch::Tensor(torch::nn::Module&, int)> loss;
  int steps = 3;
  double max_norm = 0.05;
  double norm_type = 2;
};

struct Trial {
  std::vector<double> norms;
  std::map<std::string, torch::Tensor> params;
};

std::unique_ptr<torch::optim::Optimizer> sgd(const std::vector<torch::Tensor>& params) {
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
}

Trial unsharded(const Case& c) {
  auto m = c.model->clone();
  const auto params = shardplan::unique_parameters(*m);
  auto opt = sgd(params);
  Trial r;
  for (int s = 0; s < c.steps; ++s) {
    opt->zero_grad();
    c.loss(*m, s).backward();
    r.norms.push_back(torch::nn::utils::clip_grad_norm_(params, c.max_norm, c.norm_type));
    opt->step();
  }
  for (const auto& p : m->named_parameters()) r.params[p.key()] = p.value().detach().clone();
  return r;
}

// Every rank must return the very same total: rank 0's is returned.
Trial sharded(const Case& c, int world) {
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  for (int r = 0; r < world; ++r) models.push_back(c.model->clone());
  std::vector<std::vector<double>> norms(world);
  Trial out;
  std::mutex mu;
  shardplan::run_ranks_in_threads(world, [&](World& w) {
    auto& m = *models[w.rank()];
    const auto report = shardplan::parallelize(m, c.plan, w);
    auto opt = sgd(shardplan::unique_parameters(m));
    for (int s = 0; s < c.steps; ++s) {
      opt->zero_grad();
      c.loss(m, s).backward();
      norms[w.rank()].push_back(shardplan::clip_grad_norm_(m, report, w, c.max_norm, c.norm_type));
      opt->step();
      shardplan::check_replicas(m, report, w);  // replicas (shared kv heads too) stay identical
    }
    auto full = shardplan::collect_state_dict(m, report, w, 0);
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [name, t] : full) out.params[name] = t;
  });
  for (int r = 1; r < world; ++r) EXPECT_EQ(norms[r], norms[0]) << "rank " << r << " of " << world;
  out.norms = norms[0];
  return out;
}

void expect_same(const Trial& got, const Trial& want, double tol, const std::string& what) {
  ASSERT_EQ(got.norms.size(), want.norms.size()) << what;
  for (size_t s = 0; s < want.norms.size(); ++s)
    EXPECT_LE(std::abs(got.norms[s] - want.norms[s]), tol * std::max(1.0, std::abs(want.norms[s])))
        << what << " step " << s << ": " << got.norms[s] << " vs " << want.norms[s];
  for (const auto& [name, t] : want.params) {
    const auto it = got.params.find(name);
    ASSERT_NE(it, got.params.end()) << what << ": " << name;
    EXPECT_LE(parity::rel_err(it->second, t), tol) << what << ": " << name;
  }
}

// Clipping must happen at every step, or the test would not test it.
void expect_clips(const Trial& want, double max_norm, const std::string& what) {
  for (double n : want.norms) EXPECT_GT(n, max_norm * 1.01) << what;
}

void check(const Case& c, std::initializer_list<int> worlds, double tol, const std::string& what) {
  const Trial want = unsharded(c);
  expect_clips(want, c.max_norm, what);
  for (int world : worlds) expect_same(sharded(c, world), want, tol, what + " at " + std::to_string(world));
}

// ------------------------------------------------------------ models

Case mlp_case(torch::Dtype dtype = torch::kDouble) {
  torch::manual_seed(1);
  Case c{ReadmeMlp().ptr(), plan_file("mlp"), nullptr};
  c.model->to(dtype);
  auto x = torch::randn({5, 6}, dtype), t = torch::randn({5, 6}, dtype);
  c.loss = [x, t](torch::nn::Module& m, int s) {
    return (dynamic_cast<ReadmeMlpImpl&>(m).forward(x * (1 + 0.1 * s)) - t).pow(2).sum();
  };
  return c;
}

const ex::Overrides kGpt = {{"vocab", "32"}, {"context", "8"}, {"embed", "16"},
                            {"heads", "4"},  {"layers", "2"},  {"mlp", "24"}};

std::function<torch::Tensor(torch::nn::Module&, int)> lm_loss(int64_t vocab, int64_t batch, int64_t context,
                                                               bool llama) {
  torch::manual_seed(9);
  std::vector<ex::Batch> batches;
  for (int s = 0; s < 4; ++s)
    batches.push_back({torch::randint(vocab, {batch, context}), torch::randint(vocab, {batch, context})});
  return [batches, llama](torch::nn::Module& m, int s) {
    if (llama) return dynamic_cast<ex::LlamaImpl&>(m).loss(batches[s]);
    return dynamic_cast<ex::GPTImpl&>(m).loss(batches[s]);
  };
}

Case gpt_case(torch::Dtype dtype = torch::kDouble) {
  torch::manual_seed(3);
  Case c{ex::make_model("gpt", kGpt).module, plan_file("gpt"), lm_loss(32, 3, 8, false)};
  c.model->to(dtype);
  c.max_norm = 0.1;
  return c;
}

Case llama_case(const std::string& plan, int kv_heads) {
  Case c{llama_fixture::build(llama_fixture::config(kv_heads)), llama_fixture::plan(plan), lm_loss(32, 2, 8, true)};
  c.max_norm = 0.1;
  return c;
}

// ------------------------------------------------------------ parity

TEST(ClipGrad, ReadmeMlpEqualsTorchOnTheUnshardedModel) {
  for (double p : {2.0, 1.0, 3.0, kInf}) {
    Case c = mlp_case();
    c.norm_type = p;
    c.max_norm = p == kInf ? 0.2 : 0.5;
    check(c, {1, 2, 4}, 1e-12, "mlp p=" + std::to_string(p));
  }
}

TEST(ClipGrad, GptVocabParallelEqualsTorchOnTheUnshardedModel) {
  for (double p : {2.0, kInf}) {
    Case c = gpt_case();
    c.norm_type = p;
    c.max_norm = p == 2 ? 0.1 : 0.01;
    check(c, {2, 4}, 1e-12, "gpt p=" + std::to_string(p));
  }
}

TEST(ClipGrad, LlamaSharedKvHeadsCountOnce) {
  // 2 kv heads over 4 ranks: each kv head is held by two ranks (a `shared`
  // split); counted twice, the norm would be too large.
  check(llama_case("llama", 2), {4}, 1e-10, "llama kv 2");
}

TEST(ClipGrad, LlamaSequenceParallelNormsAreReplicas) {
  // Under sequence parallelism the RMSNorms see T/N positions each, but
  // their gradients are summed over the axis in backward
  // (sequence_parallel_param), so every rank holds the whole one.
  check(llama_case("llama_sp", 4), {2, 4}, 1e-10, "llama_sp");
}

// A tied weight (token embedding = LM head, vocab-parallel on both) is one
// tensor under two paths: counted and scaled once.
struct TiedLmImpl : torch::nn::Cloneable<TiedLmImpl> {
  TiedLmImpl() { reset(); }
  void reset() override {
    emb = register_module("emb", shardplan::nn::Embedding(16, 8));
    ln = register_module("ln", shardplan::nn::LayerNorm(std::vector<int64_t>{8}));
    head = register_module("head", shardplan::nn::Linear(torch::nn::LinearOptions(8, 16).bias(false)));
    loss = register_module("loss", shardplan::nn::CrossEntropyLoss());
    tie();
  }
  void tie() { head->weight = shardplan::tie_parameter(*head, "weight", emb->weight); }
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& device = c10::nullopt) const override {
    auto copy = torch::nn::Cloneable<TiedLmImpl>::clone(device);  // unties: tie again
    std::dynamic_pointer_cast<TiedLmImpl>(copy)->tie();
    return copy;
  }
  shardplan::nn::Embedding emb{nullptr};
  shardplan::nn::LayerNorm ln{nullptr};
  shardplan::nn::Linear head{nullptr};
  shardplan::nn::CrossEntropyLoss loss{nullptr};
};
TORCH_MODULE(TiedLm);

TEST(ClipGrad, TiedWeightCountsOnce) {
  torch::manual_seed(2);
  Case c{TiedLm().ptr(),
         shardplan::parse_plan("mesh: {model: auto}\nrules:\n"
                               "  - {match: 'emb\\.weight', layout: [model, null]}\n"
                               "  - {match: 'head\\.weight', layout: [model, null], output: sharded}\n"
                               "  - {match: 'loss', layout: [null, model]}\n",
                               "tied.yaml"),
         nullptr};
  c.model->to(torch::kDouble);
  const auto ids = torch::randint(16, {4, 5}), targets = torch::randint(16, {4, 5});
  c.loss = [ids, targets](torch::nn::Module& m, int) {
    auto& lm = dynamic_cast<TiedLmImpl&>(m);
    const auto logits = lm.head(lm.ln(lm.emb(ids)));
    return lm.loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  };
  c.max_norm = 0.05;
  check(c, {1, 2, 4}, 1e-12, "tied");
}

TEST(ClipGrad, Float32IsCloseToTheUnshardedFloat32Run) {
  for (auto make : {&mlp_case, &gpt_case}) {
    const Case c = make(torch::kFloat);
    const Trial want = unsharded(c);
    expect_clips(want, c.max_norm, "float32");
    expect_same(sharded(c, 2), want, 1e-5, "float32");
  }
}

TEST(ClipGrad, GradNormChangesNothing) {
  const Case c = mlp_case();
  shardplan::run_ranks_in_threads(2, [&](World& w) {
    auto m = c.model->clone();
    const auto report = shardplan::parallelize(*m, c.plan, w);
    c.loss(*m, 0).backward();
    const auto before = m->named_parameters()["fc1.weight"].grad().clone();
    const double n = shardplan::grad_norm(*m, report, w);
    EXPECT_TRUE(at::equal(before, m->named_parameters()["fc1.weight"].grad()));
    EXPECT_DOUBLE_EQ(n, shardplan::clip_grad_norm_(*m, report, w, 1e9));  // no clip: the same total
  });
}

// The budget: at most one all-reduce per mesh axis. The norm's
// pieces are summed locally and reduced once over the world, whatever the
// plan (MLP, vocab-parallel GPT, SP Llama), and clipping adds nothing.
TEST(ClipGrad, OneAllReducePerClip) {
  for (const Case& c : {mlp_case(), gpt_case(), llama_case("llama_sp", 2)})
    shardplan::run_ranks_in_threads(2, [&](World& w) {
      auto m = c.model->clone();
      const auto report = shardplan::parallelize(*m, c.plan, w);
      c.loss(*m, 0).backward();
      w.reset_stats();
      shardplan::clip_grad_norm_(*m, report, w, c.max_norm, c.norm_type);
      EXPECT_EQ(w.total_stats().calls, 1u) << "rank " << w.rank();
      w.reset_stats();
      shardplan::grad_norm(*m, report, w, kInf);
      EXPECT_EQ(w.total_stats().calls, 1u) << "rank " << w.rank() << ", inf";
    });
}

// ------------------------------------------------------------ in-process wrapper

// The wrapper's own training: clip_grad_norm_(*tp) on tp->parameters().
void expect_wrapper_equals_torch(const Case& c, int world, double tol, const std::string& what) {
  const Trial want = unsharded(c);
  expect_clips(want, c.max_norm, what);
  // Every replica computes the step's loss; the wrapper needs a forward of
  // tensors, so the step rides along as one.
  auto loss = c.loss;
  shardplan::TensorParallel tp(c.model->clone(), c.plan, std::vector<std::string>(world, "cpu"),
                               [loss](torch::nn::Module& m, const std::vector<at::Tensor>& in) {
                                 return loss(m, static_cast<int>(in[0].item<int64_t>()));
                               });
  auto opt = sgd(tp->parameters());
  Trial got;
  for (int s = 0; s < c.steps; ++s) {
    opt->zero_grad();
    tp->forward(torch::full({}, s, torch::kLong)).backward();
    got.norms.push_back(shardplan::clip_grad_norm_(*tp, c.max_norm, c.norm_type));
    opt->step();
  }
  for (const auto& kv : tp->state_dict()) got.params[kv.key()] = kv.value();
  expect_same(got, want, tol, what + " at " + std::to_string(world));
}

TEST(ClipGrad, TensorParallelWrapperCountsEachElementOnce) {
  for (int world : {2, 4})
    for (double p : {2.0, kInf}) {
      Case c = mlp_case();
      c.norm_type = p;
      c.max_norm = p == 2 ? 0.5 : 0.2;
      expect_wrapper_equals_torch(c, world, 1e-12, "wrapper mlp");
    }
  // 2 kv heads over 4 ranks: the wrapper exposes each shared head once.
  expect_wrapper_equals_torch(llama_case("llama", 2), 4, 1e-10, "wrapper llama kv 2");
}

// The wrapper exposes one copy of each replicated parameter and its other
// ranks take that copy before computing, so its replicas cannot drift: the
// check does what a forward would (the sync) and then passes.
TEST(ClipGrad, TensorParallelWrapperReplicasCannotDrift) {
  const Case c = mlp_case();
  shardplan::TensorParallel tp(c.model->clone(), c.plan, {"cpu", "cpu"},
                               [](torch::nn::Module& m, const std::vector<at::Tensor>& in) {
                                 return dynamic_cast<ReadmeMlpImpl&>(m).forward(in[0]);
                               });
  EXPECT_NO_THROW(shardplan::check_replicas(*tp));
  {
    torch::NoGradGuard no_grad;  // rank 1's copy of a replica, changed behind the wrapper's back
    tp->replica(1)->named_parameters()["fc2.bias"].add_(1.0);
  }
  EXPECT_NO_THROW(shardplan::check_replicas(*tp));
  EXPECT_TRUE(at::equal(tp->replica(1)->named_parameters()["fc2.bias"],
                        tp->replica(0)->named_parameters()["fc2.bias"]));
}

// ------------------------------------------------------------ non-finite

TEST(ClipGrad, NanOnOneRankMakesEveryRankThrow) {
  const Case c = mlp_case();
  std::vector<std::string> errors(2);
  std::vector<double> norms(2), inf_norms(2);
  shardplan::run_ranks_in_threads(2, [&](World& w) {
    auto m = c.model->clone();
    const auto report = shardplan::parallelize(*m, c.plan, w);
    c.loss(*m, 0).backward();
    // Rank 1's own shard of fc1 (counted there only).
    if (w.rank() == 1) m->named_parameters()["fc1.weight"].mutable_grad()[0][0] = NAN;
    try {
      shardplan::clip_grad_norm_(*m, report, w, 1.0, 2.0, true);
    } catch (const shardplan::Error& e) {
      errors[w.rank()] = e.what();
    }
    norms[w.rank()] = shardplan::grad_norm(*m, report, w);
    inf_norms[w.rank()] = shardplan::grad_norm(*m, report, w, kInf);
  });
  EXPECT_NE(errors[0].find("non-finite"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("nan"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[0], errors[1]);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(std::isnan(norms[r])) << r;  // as torch: a NaN gradient gives a NaN norm
    EXPECT_TRUE(std::isnan(inf_norms[r])) << r;
  }
}

// ------------------------------------------------------------ bad input

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const shardplan::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ClipGrad, BadArgumentsAndReportsAreOneLineBeforeAnyCommunication) {
  const Case c = mlp_case();
  shardplan::run_ranks_in_threads(2, [&](World& w) {
    auto m = c.model->clone();
    const auto report = shardplan::parallelize(*m, c.plan, w);
    c.loss(*m, 0).backward();
    const auto before = m->named_parameters()["fc2.bias"].grad().clone();
    for (double p : {0.0, -1.0, double(NAN)})
      EXPECT_NE(error_of([&] { shardplan::clip_grad_norm_(*m, report, w, 1.0, p); }).find("norm_type"),
                std::string::npos);
    EXPECT_NE(error_of([&] { shardplan::grad_norm(*m, report, w, 0.0); }).find("norm_type"), std::string::npos);
    for (double max_norm : {double(NAN), -1.0})
      EXPECT_NE(error_of([&] { shardplan::clip_grad_norm_(*m, report, w, max_norm); }).find("max_norm"),
                std::string::npos);

    auto renamed = report;
    renamed.rows[1].path = "fc1.b";
    const std::string e = error_of([&] { shardplan::clip_grad_norm_(*m, renamed, w, 1.0); });
    EXPECT_NE(e.find("does not describe this model"), std::string::npos) << e;
    EXPECT_NE(e.find("'fc1.bias'"), std::string::npos) << e;
    auto reshaped = report;
    reshaped.rows[2].local_shape = {8, 8};
    EXPECT_NE(error_of([&] { shardplan::grad_norm(*m, reshaped, w); }).find("fc2.weight"), std::string::npos);
    auto shorter = report;
    shorter.rows.pop_back();
    EXPECT_NE(error_of([&] { shardplan::grad_norm(*m, shorter, w); }).find("missing"), std::string::npos);
    auto other_rank = report;
    other_rank.rank = 1 - w.rank();
    EXPECT_NE(error_of([&] { shardplan::grad_norm(*m, other_rank, w); }).find("this is rank"), std::string::npos);
    EXPECT_EQ(error_of([&] { shardplan::grad_norm(*m, report, w, 2.0); }), "");  // nobody left waiting
    // Nothing changed.
    EXPECT_TRUE(at::equal(before, m->named_parameters()["fc2.bias"].grad()));
  });
}

}  // namespace

}  // namespace test_clip_grad
