// The Pipeline runtime against one process on the global batch (float64,
// 1e-10): the example GPT, the Llama (tied and untied) and a Sequential MLP
// at {pipe: 2} and {pipe: 4}, GPipe and 1F1B, auto and explicit stages; the
// GPT interleaved too, with plans/gpt.yaml's tensor parallelism in each
// stage ({pipe: 2, model: 2}) and with a data axis ({data: 2, pipe: 2},
// {data: 2, pipe: 2, model: 2}), with sequence parallelism and async tensor
// parallelism in the stages: the loss on every rank, every parameter's
// gradient (each on exactly its stage's ranks) and the parameters after 3
// Adam steps. And what a step refuses.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "models/gpt.h"
#include "models/llama.h"
#include "shardplan/checkpoint.h"
#include "shardplan/clip_grad.h"
#include "shardplan/error.h"
#include "shardplan/parallelize.h"
#include "shardplan/pipeline.h"
#include "shardplan/plan.h"
#include "shardplan/tied.h"
#include "shardplan/world.h"

namespace test_pipeline_run {

namespace {

using namespace shardplan;
namespace ex = shardplan::examples;

constexpr int kSteps = 3;
constexpr double kTol = 1e-10;

// A model under test: how to copy it for a rank, its pieces, its loss.
struct Subject {
  std::function<std::shared_ptr<torch::nn::Module>()> clone;
  std::function<PipelineModel&(torch::nn::Module&)> pieces;
  std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)> forward;
  Pipeline::LossFn loss;
  std::vector<std::pair<at::Tensor, at::Tensor>> batches;
};

struct Result {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> grads;   // after the first step's backward
  std::map<std::string, at::Tensor> params;  // after every step
  std::vector<double> norms;                 // before clipping, per step (with max_norm)
};

at::Tensor gpt_loss(const at::Tensor& logits, const at::Tensor& target) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.t().reshape(-1));
}

// One of the example language models, float64, with batches of tokens.
template <class Impl>
Subject lm_subject(const std::shared_ptr<torch::nn::Module>& model, Pipeline::LossFn loss) {
  model->to(torch::kDouble);
  Subject s;
  s.clone = [model] { return model->clone(); };
  s.pieces = [](torch::nn::Module& m) -> PipelineModel& { return dynamic_cast<Impl&>(m); };
  s.forward = [](torch::nn::Module& m, const at::Tensor& x) { return dynamic_cast<Impl&>(m).forward(x); };
  s.loss = std::move(loss);
  torch::manual_seed(7);
  for (int i = 0; i < kSteps; ++i)
    s.batches.emplace_back(torch::randint(32, {8, 6}, torch::kLong), torch::randint(32, {8, 6}, torch::kLong));
  return s;
}

Subject gpt_subject(int layers = 4) {
  ex::GPTConfig c;
  c.vocab = 32, c.context = 6, c.embed = 16, c.heads = 2, c.layers = layers, c.mlp = 24;
  torch::manual_seed(5);
  return lm_subject<ex::GPTImpl>(ex::GPT(c).ptr(), gpt_loss);
}

// tie: lm_head shares the embedding, in the first stage and the last.
Subject llama_subject(int tie, int layers = 2) {
  ex::LlamaConfig c;
  c.vocab = 32, c.context = 6, c.embed = 16, c.heads = 2, c.kv_heads = 1, c.layers = layers, c.mlp = 24, c.tie = tie;
  torch::manual_seed(5);
  return lm_subject<ex::LlamaImpl>(ex::Llama(c).ptr(), [](const at::Tensor& logits, const at::Tensor& target) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape(-1));
  });
}

Subject mlp_subject() {
  torch::manual_seed(5);
  torch::nn::Sequential seq(torch::nn::Linear(6, 12), torch::nn::Tanh(), torch::nn::Linear(12, 12), torch::nn::Tanh(),
                            torch::nn::Linear(12, 12), torch::nn::Tanh(), torch::nn::Linear(12, 3));
  seq->to(torch::kDouble);
  Subject s;
  s.clone = [seq] { return seq->clone(); };
  // The adapter lives with the rank's copy (see run_pipeline).
  s.forward = [](torch::nn::Module& m, const at::Tensor& x) {
    return dynamic_cast<torch::nn::SequentialImpl&>(m).forward(x);
  };
  s.loss = [](const at::Tensor& out, const at::Tensor& y) { return torch::mse_loss(out, y); };
  torch::manual_seed(7);
  for (int i = 0; i < kSteps; ++i)
    s.batches.emplace_back(torch::randn({12, 6}, torch::kDouble), torch::randn({12, 3}, torch::kDouble));
  return s;
}

void record(std::map<std::string, at::Tensor>& into, const std::vector<std::pair<std::string, at::Tensor>>& named,
            bool grads) {
  for (const auto& [name, t] : named) into[name] = (grads ? t.grad() : t).detach().clone();
}

// With max_norm > 0, torch's clip_grad_norm_ before each step (norms recorded).
Result reference(const Subject& s, double max_norm = 0) {
  auto model = s.clone();
  // A tied tensor once, as the pipeline's stages step it.
  torch::optim::Adam opt(unique_parameters(*model), torch::optim::AdamOptions(1e-2));
  Result r;
  for (int i = 0; i < kSteps; ++i) {
    opt.zero_grad();
    const at::Tensor l = s.loss(s.forward(*model, s.batches[i].first), s.batches[i].second);
    l.backward();
    r.losses.push_back(l.item<double>());
    if (i == 0)
      for (const auto& p : model->named_parameters()) r.grads[p.key()] = p.value().grad().detach().clone();
    if (max_norm > 0) r.norms.push_back(torch::nn::utils::clip_grad_norm_(unique_parameters(*model), max_norm));
    opt.step();
  }
  for (const auto& p : model->named_parameters()) r.params[p.key()] = p.value().detach().clone();
  return r;
}

// Each rank's losses, and the union of their gradients and parameters
// (every name from exactly one rank).
Result run_pipeline(const Subject& s, const std::string& plan_text, int world_size) {
  const Plan plan = parse_plan(plan_text, "p.yaml");
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  for (int r = 0; r < world_size; ++r) models.push_back(s.clone());
  std::mutex mu;
  Result all;
  std::vector<std::vector<double>> losses(world_size);
  run_ranks_in_threads(world_size, [&](World& world) {
    torch::nn::Module& model = *models[world.rank()];
    std::unique_ptr<SequentialPipeline> seq;
    if (!s.pieces)
      seq = std::make_unique<SequentialPipeline>(
          torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(models[world.rank()])));
    PipelineModel& pieces = s.pieces ? s.pieces(model) : *seq;
    Pipeline pipe(model, pieces, plan, world);
    torch::optim::Adam opt(pipe.parameters(), torch::optim::AdamOptions(1e-2));
    Result mine;
    for (int i = 0; i < kSteps; ++i) {
      opt.zero_grad();
      losses[world.rank()].push_back(pipe.step(s.batches[i].first, s.batches[i].second, s.loss));
      if (i == 0) record(mine.grads, pipe.named_parameters(), true);
      opt.step();
    }
    record(mine.params, pipe.named_parameters(), false);
    std::lock_guard<std::mutex> lock(mu);
    for (auto* m : {&mine.grads, &mine.params})
      for (auto& [name, t] : *m) {
        auto& into = m == &mine.grads ? all.grads : all.params;
        EXPECT_TRUE(into.emplace(name, t).second) << name << " on two ranks";
      }
  });
  for (int r = 0; r < world_size; ++r) {
    EXPECT_EQ(losses[r].size(), static_cast<size_t>(kSteps));
    for (size_t i = 0; i < losses[r].size(); ++i) {
      if (r == 0) all.losses.push_back(losses[r][i]);
      EXPECT_EQ(losses[r][i], losses[0][i]) << "rank " << r << " step " << i;
    }
  }
  return all;
}

void expect_same(const Result& ref, const Result& got) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) EXPECT_NEAR(got.losses[i], ref.losses[i], kTol) << "step " << i;
  for (const bool grads : {true, false}) {
    SCOPED_TRACE(grads ? "gradients after step 1" : "parameters after the last step");
    const auto& want = grads ? ref.grads : ref.params;
    const auto& have = grads ? got.grads : got.params;
    EXPECT_EQ(have.size(), want.size());
    for (const auto& [name, t] : want) {
      const auto it = have.find(name);
      ASSERT_NE(it, have.end()) << name << " on no rank";
      EXPECT_LT((it->second - t).abs().max().item<double>(), kTol) << name;
    }
  }
}

std::string plan_of(int pipe, const std::string& schedule, int micro, const std::string& stages = "auto") {
  return "version: 1\nmesh: {pipe: " + std::to_string(pipe) + "}\npipeline: {schedule: " + schedule +
         ", micro_batches: " + std::to_string(micro) + ", stages: " + stages + "}\nrules: []\n";
}

}  // namespace

TEST(PipelineRun, GptMatchesOneProcessAtPipe2And4) {
  const Subject s = gpt_subject();
  const Result ref = reference(s);
  for (const char* schedule : {"gpipe", "1f1b"})
    for (int pipe : {2, 4}) {
      SCOPED_TRACE(std::string(schedule) + " pipe " + std::to_string(pipe));
      expect_same(ref, run_pipeline(s, plan_of(pipe, schedule, 4), pipe));
    }
}

TEST(PipelineRun, GptWithExplicitStagesAndOneMicroBatchPerSample) {
  const Subject s = gpt_subject();
  const Result ref = reference(s);
  expect_same(ref, run_pipeline(s, plan_of(2, "1f1b", 8, "[['tok_emb|pos_emb'], ['blocks\\.\\d', 'ln_f|head']]"), 2));
  expect_same(ref, run_pipeline(s, plan_of(2, "gpipe", 1), 2));
}

// Two model chunks per rank: rank 0 runs model stages 0 and 2, rank 1 stages
// 1 and 3, and rank 1's chunk 0 sends to rank 0's chunk 1.
TEST(PipelineRun, GptInterleavedMatchesOneProcess) {
  const Subject s = gpt_subject();
  expect_same(reference(s), run_pipeline(s,
                                         "version: 1\nmesh: {pipe: 2}\npipeline: {schedule: interleaved, "
                                         "micro_batches: 4, virtual_stages: 2}\nrules: []\n",
                                         2));
}

// Tied: the first stage steps model.embed_tokens.weight, the last
// lm_head.weight, copies of one tensor whose gradients the pipeline sums.
TEST(PipelineRun, LlamaTiedAndUntiedMatchesOneProcess) {
  for (int tie : {0, 1}) {
    const Subject s = llama_subject(tie);
    const Result ref = reference(s);
    for (const char* schedule : {"gpipe", "1f1b"})
      for (int pipe : {2, 4}) {
        SCOPED_TRACE("tie " + std::to_string(tie) + " " + schedule + " pipe " + std::to_string(pipe));
        expect_same(ref, run_pipeline(s, plan_of(pipe, schedule, 4), pipe));
      }
  }
}

TEST(PipelineRun, SequentialMlpMatchesOneProcess) {
  const Subject s = mlp_subject();
  const Result ref = reference(s);
  for (const char* schedule : {"gpipe", "1f1b"})
    for (int pipe : {2, 4}) {
      SCOPED_TRACE(std::string(schedule) + " pipe " + std::to_string(pipe));
      expect_same(ref, run_pipeline(s, plan_of(pipe, schedule, pipe == 4 ? 4 : 3), pipe));
    }
}

// plans/<file> with its mesh replaced by `mesh` and a pipeline: key.
std::string yaml_with(const std::string& file, const std::string& mesh, const std::string& schedule, int micro = 2) {
  std::ifstream in(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/" + file);
  std::stringstream text;
  text << in.rdbuf();
  std::string yaml = text.str();
  const std::string old = "mesh: {model: auto}";
  const size_t at = yaml.find(old);
  EXPECT_NE(at, std::string::npos);
  return yaml.replace(at, old.size(),
                      "mesh: " + mesh + "\npipeline: {schedule: " + schedule +
                          ", micro_batches: " + std::to_string(micro) + "}");
}

std::string gpt_yaml_with(const std::string& mesh, const std::string& schedule) {
  return yaml_with("gpt.yaml", mesh, schedule);
}

void expect_shards(const std::map<std::string, at::Tensor>& whole, const ParallelReport& report,
                   const std::vector<std::pair<std::string, at::Tensor>>& mine, bool grads) {
  const StateDict full(whole.begin(), whole.end());
  std::map<std::string, at::Tensor> want;
  for (auto& [name, t] : relocate_state_dict(full, report)) want[name] = t;
  for (const auto& [name, t] : mine) {
    const at::Tensor got = grads ? t.grad() : t.detach();
    ASSERT_TRUE(got.defined()) << name;
    EXPECT_LT((got - want.at(name)).abs().max().item<double>(), kTol) << name << (grads ? " gradient" : "");
  }
}

// parallelize() over the plan's other axes, then the Pipeline: every rank's
// shards of the gradients after step 1 and of the parameters after the last
// against the reference's, the loss on every rank, and every parameter on
// `copies` ranks (the model and data ranks of its stage). With max_norm,
// clip_grad_norm_ over the pipeline before each step, its norm the
// reference's. The loss is the model's output_loss (vocab-parallel under
// plans/gpt.yaml).
void expect_sharded_run(const Subject& s, const Result& ref, const std::string& yaml, int world_size, int copies,
                        double max_norm = 0) {
  const Plan plan = parse_plan(yaml, "gpt_pipe.yaml");
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  for (int r = 0; r < world_size; ++r) models.push_back(s.clone());
  std::mutex mu;
  std::map<std::string, int> ranks_of;
  run_ranks_in_threads(world_size, [&](World& world) {
    torch::nn::Module& model = *models[world.rank()];
    const ParallelReport report = parallelize(model, plan, world);
    if (plan.rules.size() > 0)  // a sharded stage indeed
      EXPECT_TRUE(std::any_of(report.rows.begin(), report.rows.end(),
                              [](const ReportRow& r) { return r.local_shape != r.global_shape; }));
    Pipeline pipe(model, s.pieces(model), plan, world, &report);
    auto& example = dynamic_cast<ex::ExampleModel&>(model);
    const Pipeline::LossFn loss = [&example](const at::Tensor& out, const at::Tensor& target) {
      return example.output_loss(out, target);
    };
    torch::optim::Adam opt(pipe.parameters(), torch::optim::AdamOptions(1e-2));
    for (int i = 0; i < kSteps; ++i) {
      opt.zero_grad();
      EXPECT_NEAR(pipe.step(s.batches[i].first, s.batches[i].second, loss), ref.losses[i], kTol) << "step " << i;
      if (i == 0) expect_shards(ref.grads, report, pipe.named_parameters(), true);
      if (max_norm > 0)
        EXPECT_NEAR(clip_grad_norm_(pipe, report, world, max_norm), ref.norms[i], kTol) << "norm, step " << i;
      opt.step();
    }
    expect_shards(ref.params, report, pipe.named_parameters(), false);
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [name, t] : pipe.named_parameters()) ++ranks_of[name];
  });
  EXPECT_EQ(ranks_of.size(), ref.params.size());
  for (const auto& [name, n] : ranks_of) EXPECT_EQ(n, copies) << name;
}

TEST(PipelineRun, GptWithTensorParallelStagesMatchesOneProcess) {
  const Subject s = gpt_subject();
  const Result ref = reference(s);
  for (const char* schedule : {"gpipe", "1f1b"}) {
    SCOPED_TRACE(schedule);
    expect_sharded_run(s, ref, gpt_yaml_with("{pipe: 2, model: 2}", schedule), 4, 2);
  }
}

// Sequence parallelism inside each stage: the boundary activation is the
// model rank's part of the sequence ([T/2, B, E] for the GPT, [B, T/2, E]
// for the Llama), sent to the same model rank of the next stage; the GPT's
// causal mask spans the whole sequence the attention gathers. And async
// tensor parallelism (ring exchanges over the model axis) between the
// pipeline's point-to-point messages.
TEST(PipelineRun, SequenceParallelAndAsyncStagesMatchOneProcess) {
  const Subject gpt = gpt_subject();
  const Result gpt_ref = reference(gpt);
  for (const char* file : {"gpt_sp.yaml", "gpt_async.yaml"})
    for (const char* schedule : {"gpipe", "1f1b", "interleaved, virtual_stages: 2"}) {
      SCOPED_TRACE(std::string(file) + " " + schedule);
      expect_sharded_run(gpt, gpt_ref, yaml_with(file, "{pipe: 2, model: 2}", schedule), 4, 2);
    }
  for (int tie : {0, 1}) {
    const Subject llama = llama_subject(tie);
    const Result ref = reference(llama);
    for (const char* file : {"llama_sp.yaml", "llama_async.yaml"}) {
      SCOPED_TRACE(std::string(file) + " tie " + std::to_string(tie));
      expect_sharded_run(llama, ref, yaml_with(file, "{pipe: 2, model: 2}", "1f1b"), 4, 2);
    }
  }
}

// The matrix: the example GPT and the tied Llama (8 pieces each, so
// that 4 stages interleave 2 chunks) at {pipe: 2}, {pipe: 4}, {pipe: 2,
// model: 2} and {data: 2, pipe: 2, model: 2}, under every schedule.
TEST(PipelineRun, EveryMeshAndScheduleForGptAndLlama) {
  struct Mesh {
    std::string mesh;
    int world, copies;
  };
  const std::vector<Mesh> meshes = {
      {"{pipe: 2}", 2, 1}, {"{pipe: 4}", 4, 1}, {"{pipe: 2, model: 2}", 4, 2}, {"{data: 2, pipe: 2, model: 2}", 8, 4}};
  for (const bool llama : {false, true}) {
    const Subject s = llama ? llama_subject(1, 6) : gpt_subject(6);
    const Result ref = reference(s);
    for (const Mesh& m : meshes)
      for (const char* schedule : {"gpipe", "1f1b", "interleaved, virtual_stages: 2"}) {
        SCOPED_TRACE(std::string(llama ? "llama " : "gpt ") + m.mesh + " " + schedule);
        const int micro = m.mesh == "{pipe: 4}" ? 4 : 2;
        const std::string yaml =
            m.mesh.find("model") == std::string::npos
                ? "version: 1\nmesh: " + m.mesh + "\npipeline: {schedule: " + schedule +
                      ", micro_batches: " + std::to_string(micro) + "}\nrules: []\n"
                : yaml_with(llama ? "llama.yaml" : "gpt.yaml", m.mesh, schedule, micro);
        expect_sharded_run(s, ref, yaml, m.world, m.copies);
      }
  }
}

// The batch axis: each data rank's pipeline trains on its half of the batch
// and the stage's gradients are averaged over `data`; with the model axis
// too, 8 ranks: {data: 2, pipe: 2, model: 2}.
TEST(PipelineRun, GptWithADataAxisMatchesOneProcess) {
  const Subject s = gpt_subject();
  const Result ref = reference(s);
  const std::string no_rules = "version: 1\nmesh: {data: 2, pipe: 2}\npipeline: {micro_batches: 2}\nrules: []\n";
  expect_sharded_run(s, ref, no_rules, 4, 2);
  expect_sharded_run(s, ref, gpt_yaml_with("{data: 2, pipe: 2, model: 2}", "1f1b"), 8, 4);
}

// The norm over every stage: each rank counts its stage's parameters once
// across the model axis and the batch axis, a tensor tied across stages
// once. Clipped at 0.5, below every step's norm.
TEST(PipelineRun, ClippingCountsEveryStageOnce) {
  const Subject gpt = gpt_subject();
  const Result ref = reference(gpt, 0.5);
  for (double n : ref.norms) ASSERT_GT(n, 0.5);
  expect_sharded_run(gpt, ref, "version: 1\nmesh: {pipe: 2}\npipeline: {micro_batches: 2}\nrules: []\n", 2, 1, 0.5);
  expect_sharded_run(gpt, ref, gpt_yaml_with("{data: 2, pipe: 2, model: 2}", "1f1b"), 8, 4, 0.5);
  const Subject tied = llama_subject(1);
  const Result tied_ref = reference(tied, 0.5);
  expect_sharded_run(tied, tied_ref, "version: 1\nmesh: {pipe: 2}\npipeline: {micro_batches: 2}\nrules: []\n", 2, 1,
                     0.5);
}

TEST(PipelineRun, RefusesWhatItCannotRun) {
  const Subject s = gpt_subject();
  auto model = s.clone();
  auto& gpt = dynamic_cast<ex::GPTImpl&>(*model);
  EXPECT_THROW(
      run_ranks_in_threads(2,
                           [&](World& world) {
                             auto mine = s.clone();
                             Pipeline pipe(*mine, dynamic_cast<ex::GPTImpl&>(*mine), parse_plan(plan_of(2, "1f1b", 3), "p.yaml"),
                                           world);
                             pipe.step(s.batches[0].first, s.batches[0].second, s.loss);  // 8 rows into 3
                           }),
      Error);
  // A batch axis without parallelize()'s report, and ZeRO-3 over a stage.
  for (const std::string zero : {"", "data_parallel: {zero: 3}\n"}) {
    const Plan plan = parse_plan("version: 1\nmesh: {data: 2, pipe: 2}\npipeline: {micro_batches: 2}\n" + zero +
                                     "rules: []\n",
                                 "p.yaml");
    std::vector<std::shared_ptr<torch::nn::Module>> models;
    for (int r = 0; r < 4; ++r) models.push_back(s.clone());
    try {
      run_ranks_in_threads(4, [&](World& world) {
        auto& mine = dynamic_cast<ex::GPTImpl&>(*models[world.rank()]);
        const ParallelReport report = parallelize(mine, plan, world);
        Pipeline(mine, mine, plan, world, zero.empty() ? nullptr : &report);
      });
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(zero.empty() ? "needs parallelize()'s report" : "{zero: 3} over a part"),
                std::string::npos)
          << e.what();
    }
  }
  // A plan without the key.
  EXPECT_THROW(run_ranks_in_threads(1,
                                    [&](World& world) {
                                      Pipeline(*model, gpt, parse_plan("version: 1\nmesh: {model: 1}\nrules: []\n", "p.yaml"),
                                               world);
                                    }),
               Error);
}

}  // namespace test_pipeline_run
