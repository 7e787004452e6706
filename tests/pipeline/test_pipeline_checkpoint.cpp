// Checkpoints of pipelined runs (shardplan/pipeline_checkpoint.h) against one
// process on the global batch (float64, 1e-10): the example GPT saved after
// kSave Adam steps at {pipe: 2, model: 2}, and with ZeRO-1 at {data: 2,
// pipe: 2, model: 2}, then loaded at {pipe: 4}, {pipe: 2}, {model: 2} and
// unsharded: every continued step's loss and the parameters at the end are
// the uninterrupted run's, which needs the optimizer state back (Adam's
// moments and step count). A checkpoint saved without a pipeline loads into
// one, a tie across stages is written once, each rank holds its stage's
// parameters only, and what is refused.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "models/llama.h"
#include "shardplan/checkpoint.h"
#include "shardplan/checkpoint_meta.h"
#include "shardplan/error.h"
#include "shardplan/nn/deferred_init.h"
#include "shardplan/optimizer.h"
#include "shardplan/parallelize.h"
#include "shardplan/pipeline.h"
#include "shardplan/pipeline_checkpoint.h"
#include "shardplan/plan.h"
#include "shardplan/tied.h"
#include "shardplan/world.h"

namespace test_pipeline_checkpoint {

namespace {

using namespace shardplan;
namespace ex = shardplan::examples;
namespace fs = std::filesystem;

constexpr int kSave = 2, kSteps = 4;
constexpr double kTol = 1e-10;

struct Subject {
  std::shared_ptr<torch::nn::Module> model;  // float64, cloned for each rank
  std::vector<std::pair<at::Tensor, at::Tensor>> batches;
};

Subject subject(std::shared_ptr<torch::nn::Module> model) {
  model->to(torch::kDouble);
  Subject s{std::move(model), {}};
  torch::manual_seed(7);
  for (int i = 0; i < kSteps; ++i)
    s.batches.emplace_back(torch::randint(32, {8, 6}, torch::kLong), torch::randint(32, {8, 6}, torch::kLong));
  return s;
}

Subject gpt(int mlp = 24) {
  ex::GPTConfig c;
  c.vocab = 32, c.context = 6, c.embed = 16, c.heads = 2, c.layers = 4, c.mlp = mlp;
  torch::manual_seed(5);
  return subject(ex::GPT(c).ptr());
}

Subject tied_llama() {
  ex::LlamaConfig c;
  c.vocab = 32, c.context = 6, c.embed = 16, c.heads = 2, c.kv_heads = 1, c.layers = 2, c.mlp = 24, c.tie = 1;
  torch::manual_seed(5);
  return subject(ex::Llama(c).ptr());
}

// The whole model's forward and the loss a pipeline's last stage takes.
at::Tensor whole_loss(torch::nn::Module& m, const at::Tensor& x, const at::Tensor& y) {
  auto& model = dynamic_cast<ex::ExampleModel&>(m);
  if (auto* g = dynamic_cast<ex::GPTImpl*>(&m)) return model.output_loss(g->forward(x), y);
  return model.output_loss(dynamic_cast<ex::LlamaImpl&>(m).forward(x), y);
}

struct Reference {
  std::vector<double> losses;
  StateDict params;  // after the last step
};

// One process, uninterrupted.
Reference reference(const Subject& s) {
  auto model = s.model->clone();
  torch::optim::Adam opt(unique_parameters(*model), torch::optim::AdamOptions(1e-2));
  Reference r;
  for (int i = 0; i < kSteps; ++i) {
    opt.zero_grad();
    const at::Tensor l = whole_loss(*model, s.batches[i].first, s.batches[i].second);
    l.backward();
    r.losses.push_back(l.item<double>());
    opt.step();
  }
  for (const auto& p : model->named_parameters()) r.params.emplace_back(p.key(), p.value().detach().clone());
  return r;
}

// plans/gpt.yaml's rules with `head` instead of its mesh line ("" for a
// plan without rules over `head`'s mesh).
std::string plan_yaml(const std::string& head, bool rules = true) {
  if (!rules) return "version: 1\n" + head + "\nrules: []\n";
  std::ifstream in(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/gpt.yaml");
  std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string mesh = "mesh: {model: auto}";
  EXPECT_NE(yaml.find(mesh), std::string::npos) << "plans/gpt.yaml changed";
  return yaml.replace(yaml.find(mesh), mesh.size(), head);
}

const std::string kPipe2 = "mesh: {pipe: 2}\npipeline: {micro_batches: 2}";
const std::string kPipe2Model2 = "mesh: {pipe: 2, model: 2}\npipeline: {micro_batches: 2}";
const std::string k3dZero = "mesh: {data: 2, pipe: 2, model: 2}\nbatch_axis: data\npipeline: {micro_batches: 2}\n"
                            "data_parallel: {zero: 1}";

// A run on `world` thread ranks ("" plan: one unsharded process): loads
// `from` unless empty, trains steps [first, last) checking each loss
// against the reference, then checks its parameters (shards) against the
// reference's when last is kSteps, and saves `to` unless empty.
void run(const Subject& s, const Reference& ref, const std::string& yaml, int world_size, const std::string& from,
         int first, int last, const std::string& to = "") {
  std::optional<Plan> plan;
  if (!yaml.empty()) plan = parse_plan(yaml, "p.yaml");
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  for (int r = 0; r < world_size; ++r) models.push_back(s.model->clone());
  run_ranks_in_threads(world_size, [&](World& world) {
    torch::nn::Module& model = *models[world.rank()];
    const ParallelReport report = plan ? parallelize(model, *plan, world) : ParallelReport{};
    std::unique_ptr<Pipeline> pipe;
    if (plan && plan->pipeline.enabled)
      pipe = std::make_unique<Pipeline>(model, dynamic_cast<PipelineModel&>(model), *plan, world, &report);
    const auto adam = [](std::vector<at::Tensor> p) {
      return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2));
    };
    std::unique_ptr<Optimizer> averaged;  // over the data axis (ZeRO-1 when the plan says)
    std::unique_ptr<torch::optim::Optimizer> plain;
    if (pipe && pipe->data_parallel())
      averaged = std::make_unique<Optimizer>(*pipe->data_parallel(), adam);
    else
      plain = adam(pipe ? pipe->parameters() : unique_parameters(model));
    CheckpointOptions options = averaged ? averaged->checkpoint_options() : CheckpointOptions{};
    if (plain) options.optimizer = plain.get();
    if (!from.empty()) {
      const auto attributes = pipe ? load_checkpoint(from, *pipe, model, report, world, options)
                                   : load_checkpoint(from, model, report, world, options);
      EXPECT_EQ(attributes.at("step"), std::to_string(first));
    }
    auto& example = dynamic_cast<ex::ExampleModel&>(model);
    const Pipeline::LossFn loss = [&example](const at::Tensor& out, const at::Tensor& target) {
      return example.output_loss(out, target);
    };
    for (int i = first; i < last; ++i) {
      averaged ? averaged->zero_grad() : plain->zero_grad();
      const auto& [x, y] = s.batches[i];
      double l = 0;
      if (pipe) {
        l = pipe->step(x, y, loss);
      } else {
        const at::Tensor t = whole_loss(model, x, y);
        t.backward();
        l = t.item<double>();
      }
      EXPECT_NEAR(l, ref.losses[i], kTol) << "step " << i << " rank " << world.rank();
      if (averaged)
        averaged->step();
      else
        plain->step();
    }
    if (last == kSteps) {
      std::map<std::string, at::Tensor> want;
      for (auto& [name, t] : relocate_state_dict(ref.params, report)) want[name] = t;
      StateDict mine = pipe ? pipe->named_parameters() : StateDict{};
      if (!pipe)
        for (const auto& p : model.named_parameters()) mine.emplace_back(p.key(), p.value());
      for (const auto& [name, t] : mine)
        EXPECT_LT((t.detach() - want.at(name)).abs().max().item<double>(), kTol) << name;
    }
    if (!to.empty()) {
      options.attributes["step"] = std::to_string(last);
      pipe ? save_checkpoint(to, *pipe, model, report, world, options)
           : save_checkpoint(to, model, report, world, options);
    }
  });
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("sp_pipe_ckpt_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
                                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
  TempDir() { fs::remove_all(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string sub(const std::string& name) const { return (path / name).string(); }
};

// Where the continued runs load: {pipe: 4}, {pipe: 2} (GPipe, and
// interleaved), {model: 2}, unsharded.
void expect_loads_anywhere(const Subject& s, const Reference& ref, const std::string& dir) {
  SCOPED_TRACE("loaded at {pipe: 4}");
  run(s, ref, plan_yaml("mesh: {pipe: 4}\npipeline: {micro_batches: 4}", false), 4, dir, kSave, kSteps);
  SCOPED_TRACE("loaded at {pipe: 2}");
  run(s, ref, plan_yaml("mesh: {pipe: 2}\npipeline: {schedule: gpipe, micro_batches: 2}", false), 2, dir, kSave,
      kSteps);
  SCOPED_TRACE("loaded at {pipe: 2}, interleaved: two chunks a rank");
  run(s, ref, plan_yaml("mesh: {pipe: 2}\npipeline: {schedule: interleaved, virtual_stages: 2, micro_batches: 2}", false),
      2, dir, kSave, kSteps);
  SCOPED_TRACE("loaded at {model: 2}");
  run(s, ref, plan_yaml("mesh: {model: 2}"), 2, dir, kSave, kSteps);
  SCOPED_TRACE("loaded unsharded");
  run(s, ref, "", 1, dir, kSave, kSteps);
}

// Saved at `head` after kSave steps, then loaded there again and at
// expect_loads_anywhere's meshes.
void expect_saved_at_loads_anywhere(const std::string& head, int world_size) {
  const Subject s = gpt();
  const Reference ref = reference(s);
  TempDir tmp;
  run(s, ref, plan_yaml(head), world_size, "", 0, kSave, tmp.sub("ckpt"));
  expect_loads_anywhere(s, ref, tmp.sub("ckpt"));
  SCOPED_TRACE("loaded where it was saved");
  run(s, ref, plan_yaml(head), world_size, tmp.sub("ckpt"), kSave, kSteps);
}

}  // namespace

TEST(PipelineCheckpoint, SavedAtPipe2Model2LoadsAtAnyMesh) { expect_saved_at_loads_anywhere(kPipe2Model2, 4); }

// ZeRO-1's slices saved as whole per-parameter state, each stage its own.
TEST(PipelineCheckpoint, ZeroOneWithADataAxisLoadsAtAnyMesh) { expect_saved_at_loads_anywhere(k3dZero, 8); }

TEST(PipelineCheckpoint, UnpipelinedCheckpointLoadsIntoAPipeline) {
  const Subject s = gpt();
  const Reference ref = reference(s);
  TempDir tmp;
  run(s, ref, "", 1, "", 0, kSave, tmp.sub("ckpt"));
  run(s, ref, plan_yaml(kPipe2Model2), 4, tmp.sub("ckpt"), kSave, kSteps);
}

// The Llama's lm_head shares the embedding, kept by the first stage and the
// last: written by the first only, under both names as one process would.
TEST(PipelineCheckpoint, TieAcrossStagesIsWrittenOnce) {
  const Subject s = tied_llama();
  const Reference ref = reference(s);
  TempDir tmp;
  run(s, ref, plan_yaml(kPipe2, false), 2, "", 0, kSave, tmp.sub("ckpt"));
  std::ifstream in(tmp.sub("ckpt") + "/" + ckpt::kMetaFile);
  std::stringstream text;
  text << in.rdbuf();
  const ckpt::Meta meta = ckpt::parse_meta(text.str(), "meta");
  for (const auto& e : meta.tensors)
    if (e.name.find("lm_head.weight") != std::string::npos || e.name.find("embed_tokens.weight") != std::string::npos)
      for (const auto& p : e.pieces) EXPECT_EQ(p.rank, 0) << e.name;
  ASSERT_NE(meta.find("lm_head.weight"), nullptr);
  run(s, ref, "", 1, tmp.sub("ckpt"), kSave, kSteps);
  run(s, ref, plan_yaml(kPipe2, false), 2, tmp.sub("ckpt"), kSave, kSteps);
  // Interleaved: rank 0 runs pieces 0 and 2, rank 1 pieces 1 and 3 (the head).
  const std::string interleaved = "mesh: {pipe: 2}\npipeline: {schedule: interleaved, virtual_stages: 2, micro_batches: 2}";
  run(s, ref, plan_yaml(interleaved, false), 2, "", 0, kSave, tmp.sub("interleaved"));
  run(s, ref, "", 1, tmp.sub("interleaved"), kSave, kSteps);
}

// Other stages' parameters are released: a rank's parameter memory is its
// stage's (a tied tensor once), less than the whole model's.
TEST(PipelineCheckpoint, EachRankHoldsItsStagesParametersOnly) {
  for (const bool tied : {false, true}) {
    const Subject s = tied ? tied_llama() : gpt();
    const int64_t whole = nn::resident_parameter_bytes(*s.model);
    for (const std::string& head : {std::string("mesh: {pipe: 4}\npipeline: {micro_batches: 4}"), kPipe2Model2}) {
      const bool sharded = head == kPipe2Model2;
      const Plan plan = parse_plan(plan_yaml(head, sharded && !tied), "p.yaml");
      const int world_size = 4;
      std::vector<std::shared_ptr<torch::nn::Module>> models;
      for (int r = 0; r < world_size; ++r) models.push_back(s.model->clone());
      run_ranks_in_threads(world_size, [&](World& world) {
        torch::nn::Module& model = *models[world.rank()];
        const ParallelReport report = parallelize(model, plan, world);
        Pipeline pipe(model, dynamic_cast<PipelineModel&>(model), plan, world, &report);
        int64_t stage = 0;
        for (const auto& [name, t] : pipe.named_parameters()) stage += t.numel() * t.element_size();
        EXPECT_EQ(nn::resident_parameter_bytes(model), stage) << "rank " << world.rank();
        EXPECT_LT(stage, whole);
        std::set<const void*> kept;
        for (const auto& [name, t] : pipe.named_parameters()) kept.insert(t.unsafeGetTensorImpl());
        // The rest keep their shapes, deferred: a forward with one is refused.
        for (const auto& p : model.named_parameters())
          EXPECT_EQ(nn::is_deferred(p.value()), !kept.count(p.value().unsafeGetTensorImpl())) << p.key();
      });
    }
  }
}

TEST(PipelineCheckpoint, RefusesWhatDoesNotFit) {
  const Subject s = gpt();
  const Reference ref = reference(s);
  TempDir tmp;
  run(s, ref, plan_yaml(kPipe2, false), 2, "", 0, kSave, tmp.sub("ckpt"));
  // Another MLP width: one line naming the tensor and both shapes.
  const Subject wider = gpt(32);
  const Plan plan = parse_plan(plan_yaml(kPipe2, false), "p.yaml");
  std::vector<std::shared_ptr<torch::nn::Module>> models{wider.model->clone(), wider.model->clone()};
  std::vector<std::string> errors(2);
  run_ranks_in_threads(2, [&](World& world) {
    torch::nn::Module& model = *models[world.rank()];
    Pipeline pipe(model, dynamic_cast<PipelineModel&>(model), plan, world);
    try {
      load_checkpoint(tmp.sub("ckpt"), pipe, model, ParallelReport{}, world);
    } catch (const Error& e) {
      errors[world.rank()] = e.what();
    }
    // The model's own save would write other stages' released parameters.
    try {
      save_checkpoint(tmp.sub("bad"), model, ParallelReport{}, world);
      ADD_FAILURE() << "saved a pipelined model without its pipeline";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("pipeline_checkpoint.h"), std::string::npos) << e.what();
    }
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("fc1.weight': the checkpoint's shape is [24, 16], the model's [32, 16]"), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  EXPECT_FALSE(fs::exists(tmp.sub("bad")));
}

}  // namespace test_pipeline_checkpoint
