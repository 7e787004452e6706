// Checkpoints of mixed-precision training: the float32 masters are saved as
// the parameters, load into a bfloat16 model with masters (plain or ZeRO-1,
// any batch-axis size) or a float32 model, and a bfloat16 checkpoint is
// refused where masters are expected, changing nothing.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shardplan/checkpoint.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/mixed_precision.h"
#include "shardplan/optimizer.h"
#include "shardplan/plan.h"
#include "shardplan/training.h"
#include "shardplan/world.h"

namespace test_mixed_precision_ckpt {

using shardplan::MixedPrecision;

struct NetImpl : torch::nn::Cloneable<NetImpl> {
  NetImpl() { reset(); }
  void reset() override {
    a = register_module("a", torch::nn::Linear(5, 12));
    b = register_module("b", torch::nn::Linear(12, 2));
  }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) {
    return (b->forward(torch::tanh(a->forward(x))) - y).pow(2).mean();  // no bfloat16 mse_loss on CPU in 1.13
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(Net);

const char* const kData2 = "version: 1\nmesh: {data: 2}\nrules: []\n";
const char* const kZero2 = "version: 1\nmesh: {data: 2}\ndata_parallel: {zero: true}\nrules: []\n";
const char* const kSingle = "version: 1\nmesh: {data: 1}\nrules: []\n";

std::string temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("shardplan_mp_ckpt_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d.string();
}

std::unique_ptr<torch::optim::Optimizer> adam(std::vector<torch::Tensor> p) {
  return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2));
}

struct Batch {
  torch::Tensor x, y;
};

std::vector<Batch> batches(int n) {
  torch::manual_seed(8);
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) out.push_back({torch::randn({4, 5}), torch::randn({4, 2})});
  return out;
}

// What one run leaves: every rank's parameters and the masters (whole, in
// named_parameters() order), rank 0's.
struct Result {
  std::vector<torch::Tensor> params, masters;
  std::string load_error;
  double moved_by_bad_load = -1;
  std::map<std::string, std::string> attributes;
};

std::vector<torch::Tensor> whole_masters(shardplan::Optimizer& opt, torch::nn::Module& model) {
  if (!opt.zero()) return opt.step_tensors();
  std::map<const void*, torch::Tensor> by_param;
  for (const auto& [p, v] : opt.zero()->gather_masters()) by_param[p.unsafeGetTensorImpl()] = v.clone();
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(by_param.at(p.unsafeGetTensorImpl()));
  return out;
}

struct RunSetup {
  std::string plan;
  int world = 2;
  torch::ScalarType dtype = torch::kBFloat16;
  bool masters = true;
  std::string load, save;  // checkpoint directories, "" for none
  std::string bad_load;    // loaded after training: must fail and change nothing
  int steps = 2;
  int first_batch = 0;
};

double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    d = std::max(d, (a[i].to(torch::kDouble) - b[i].to(torch::kDouble)).abs().max().item<double>());
  return d;
}

Result run(const Net& init, const RunSetup& r) {
  const auto plan = shardplan::parse_plan(r.plan, "ckpt.yaml");
  const auto data = batches(4);
  std::vector<Net> models;
  for (int i = 0; i < r.world; ++i) {
    models.push_back(std::dynamic_pointer_cast<NetImpl>(init->clone()));
    models.back()->to(r.dtype);
  }
  Result out;
  std::mutex mu;
  shardplan::run_ranks_in_threads(r.world, [&](shardplan::World& w) {
    NetImpl& model = *models[w.rank()];
    auto t = shardplan::parallelize_for_training(model, plan, w);
    MixedPrecision mp;
    if (r.masters) mp.master_dtype = torch::kFloat;
    mp.loss_scaler = shardplan::LossScalerOptions{};
    shardplan::Optimizer opt(*t.data_parallel, adam, mp);
    std::map<std::string, std::string> attributes;
    if (!r.load.empty()) {
      attributes = shardplan::load_checkpoint(r.load, model, t.report, w, opt.checkpoint_options());
      opt.load_attributes(attributes);
    }
    for (int s = 0; s < r.steps; ++s) {
      const auto& b = data[r.first_batch + s];
      opt.zero_grad();
      opt.scale_loss(model.loss(t.local_batch(b.x.to(r.dtype)), t.local_batch(b.y.to(r.dtype)))).backward();
      opt.step();
    }
    if (!r.save.empty()) shardplan::save_checkpoint(r.save, model, t.report, w, opt.checkpoint_options());
    auto masters = r.masters ? whole_masters(opt, model) : std::vector<torch::Tensor>{};
    std::string error;
    double moved = -1;
    if (!r.bad_load.empty()) {
      std::vector<torch::Tensor> params;
      for (const auto& p : model.parameters()) params.push_back(p.detach().clone());
      try {
        shardplan::load_checkpoint(r.bad_load, model, t.report, w, opt.checkpoint_options());
      } catch (const shardplan::Error& e) {
        error = e.what();
      }
      moved = max_diff(params, model.parameters());
      if (r.masters) moved = std::max(moved, max_diff(masters, whole_masters(opt, model)));
    }
    std::lock_guard<std::mutex> lock(mu);
    if (w.rank() != 0) return;
    for (const auto& p : model.parameters()) out.params.push_back(p.detach().clone());
    out.masters = masters;
    out.attributes = attributes;
    out.load_error = error;
    out.moved_by_bad_load = moved;
    out.attributes["scale"] = std::to_string(opt.loss_scaler()->scale());
  });
  return out;
}

Net initial() {
  torch::manual_seed(2);
  return Net();
}

// Trains 2 steps and saves, then resumes for 2 more with `resume`, against
// 4 steps in one go with `straight`.
void expect_resume_equals_straight(const std::string& save_plan, const std::string& resume_plan, int resume_world) {
  const Net init = initial();
  const std::string dir = temp_dir("resume");
  RunSetup straight{save_plan};
  straight.steps = 4;
  const Result want = run(init, straight);
  RunSetup first{save_plan};
  first.save = dir;
  run(init, first);
  RunSetup second{resume_plan, resume_world};
  second.load = dir;
  second.first_batch = 2;
  const Result got = run(init, second);
  EXPECT_EQ(max_diff(got.masters, want.masters), 0);
  EXPECT_EQ(max_diff(got.params, want.params), 0);
  EXPECT_EQ(got.attributes.at("loss_scale"), "65536");
  EXPECT_EQ(got.masters.front().scalar_type(), torch::kFloat);
  std::filesystem::remove_all(dir);
}

TEST(MixedPrecisionCheckpoint, PlainMastersResumeExactly) { expect_resume_equals_straight(kData2, kData2, 2); }

TEST(MixedPrecisionCheckpoint, ZeroMastersResumeExactlyAsPlain) {
  // Saved by ZeRO-1 at 2 ranks, resumed by ZeRO-1 and by a plain optimizer.
  expect_resume_equals_straight(kZero2, kZero2, 2);
  expect_resume_equals_straight(kZero2, kData2, 2);
  expect_resume_equals_straight(kData2, kZero2, 2);
}

TEST(MixedPrecisionCheckpoint, MastersAreSavedAndLoadIntoAFloat32Model) {
  const Net init = initial();
  const std::string dir = temp_dir("f32");
  RunSetup first{kZero2};
  first.save = dir;
  const Result saved = run(init, first);
  // The checkpoint's parameters are the float32 masters.
  std::map<std::string, torch::Tensor> stored;
  for (const auto& [name, t] : shardplan::read_checkpoint(dir)) stored[name] = t;
  std::vector<torch::Tensor> in_file;
  for (const auto& p : init->named_parameters()) {
    ASSERT_TRUE(stored.count(p.key())) << p.key();
    EXPECT_EQ(stored[p.key()].scalar_type(), torch::kFloat) << p.key();
    in_file.push_back(stored[p.key()]);
  }
  EXPECT_EQ(max_diff(in_file, saved.masters), 0);
  // A float32 model without masters, one process: the masters' values.
  RunSetup f32{kSingle, 1, torch::kFloat, false};
  f32.load = dir;
  f32.steps = 0;
  const Result loaded = run(init, f32);
  EXPECT_EQ(max_diff(loaded.params, saved.masters), 0);
  EXPECT_EQ(loaded.params.front().scalar_type(), torch::kFloat);
  std::filesystem::remove_all(dir);
}

TEST(MixedPrecisionCheckpoint, Bfloat16CheckpointIntoMastersIsRefusedAndChangesNothing) {
  const Net init = initial();
  const std::string dir = temp_dir("bf16");
  RunSetup pure{kData2};
  pure.masters = false;
  pure.save = dir;
  run(init, pure);
  for (const char* plan : {kData2, kZero2}) {
    RunSetup masters{plan};
    masters.bad_load = dir;
    const Result got = run(init, masters);
    EXPECT_NE(got.load_error.find("bfloat16 in the checkpoint"), std::string::npos) << got.load_error;
    EXPECT_NE(got.load_error.find("keeps float32 master weights"), std::string::npos) << got.load_error;
    EXPECT_EQ(got.load_error.find('\n'), std::string::npos) << got.load_error;
    EXPECT_EQ(got.moved_by_bad_load, 0) << plan;
  }
  // Without masters it loads (rounding nothing: it is bfloat16 already).
  RunSetup plain{kData2};
  plain.masters = false;
  plain.load = dir;
  plain.steps = 0;
  EXPECT_NO_THROW(run(init, plain));
  std::filesystem::remove_all(dir);
}

}  // namespace test_mixed_precision_ckpt
