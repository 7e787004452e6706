// The example trainers' lr schedule (examples/models/schedule.h): its
// values against Megatron's formula worked by hand, the lr reaching every
// param group and the optimizer ZeRO-1 steps (2 and 4 thread ranks against one
// process, float64, 1e-12), the checkpoint attributes and a resume with
// the same, other and overridden settings, and the option checks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/schedule.h"
#include "models/train_args.h"
#include "shardplan/error.h"
#include "shardplan/optimizer.h"
#include "shardplan/plan.h"
#include "shardplan/training.h"
#include "shardplan/world.h"

namespace test_schedule {

namespace {

namespace ex = shardplan::examples;

ex::ScheduleSettings settings(double lr, int warmup, double lr_min = NAN, int steps = 0) {
  ex::ScheduleSettings s;
  s.lr = lr;
  s.warmup = warmup;
  s.lr_min = lr_min;
  s.decay_end = std::isnan(lr_min) ? 0 : steps;
  return s;
}

// Megatron's get_lr at num_steps = k: warmup k / W, then
// min + (max - min) * (1 + cos(pi * (k - W) / (D - W))) / 2.
TEST(Schedule, ValuesAreMegatronsCosineAtTheStepsNumber) {
  const ex::Schedule s(settings(1.0, 2, 0.0, 6));
  const std::vector<double> want = {0.5, 1.0, 0.85355339059327373, 0.5, 0.14644660940672624, 0.0};
  for (int k = 1; k <= 6; ++k) EXPECT_NEAR(s.lr_at(k), want[k - 1], 1e-15) << "step " << k;

  // A floor: the cosine between --lr and --lr-min, halfway at the middle.
  const ex::Schedule floor(settings(2e-3, 4, 2e-4, 24));
  EXPECT_DOUBLE_EQ(floor.lr_at(1), 5e-4);
  EXPECT_DOUBLE_EQ(floor.lr_at(4), 2e-3);
  EXPECT_NEAR(floor.lr_at(14), 1.1e-3, 1e-15);
  EXPECT_DOUBLE_EQ(floor.lr_at(24), 2e-4);
  for (int k = 5; k <= 24; ++k) EXPECT_LT(floor.lr_at(k), floor.lr_at(k - 1)) << "step " << k;

  // --lr-min alone decays from step 1; --warmup alone holds --lr after it.
  EXPECT_NEAR(ex::Schedule(settings(1.0, 0, 0.0, 4)).lr_at(2), 0.5, 1e-15);
  const ex::Schedule warm(settings(3e-3, 3));
  EXPECT_DOUBLE_EQ(warm.lr_at(1), 1e-3);
  EXPECT_DOUBLE_EQ(warm.lr_at(3), 3e-3);
  EXPECT_DOUBLE_EQ(warm.lr_at(1000), 3e-3);
  // Neither: --lr at every step, as before schedules.
  EXPECT_EQ(ex::Schedule(settings(7e-4, 0)).lr_at(1), 7e-4);
  EXPECT_EQ(ex::Schedule(settings(7e-4, 0)).lr_at(500), 7e-4);
}

// apply() sets the next step's lr on every param group and advance() moves
// on: an SGD step with two groups moves each by the scheduled lr.
TEST(Schedule, ApplySetsEveryParamGroup) {
  auto a = torch::ones({3}, torch::kDouble).requires_grad_();
  auto b = torch::ones({2}, torch::kDouble).requires_grad_();
  torch::optim::SGD sgd(std::vector<torch::Tensor>{a}, torch::optim::SGDOptions(0.5));
  sgd.add_param_group(torch::optim::OptimizerParamGroup({b}, std::make_unique<torch::optim::SGDOptions>(0.25)));
  ex::Schedule s(settings(1.0, 4));
  for (int k = 1; k <= 2; ++k) {
    EXPECT_EQ(s.apply(sgd), k / 4.0);
    for (auto& group : sgd.param_groups()) EXPECT_EQ(group.options().get_lr(), k / 4.0);
    a.mutable_grad() = torch::ones({3}, torch::kDouble);
    b.mutable_grad() = torch::ones({2}, torch::kDouble);
    sgd.step();
    s.advance();
  }
  // 1 - 1/4 - 2/4 for both groups.
  EXPECT_TRUE(torch::allclose(a, torch::full({3}, 0.25, torch::kDouble), 0, 0));
  EXPECT_TRUE(torch::allclose(b, torch::full({2}, 0.25, torch::kDouble), 0, 0));
  EXPECT_EQ(s.position(), 2);
}

torch::nn::Sequential small_net() {
  torch::manual_seed(3);
  torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
  net->to(torch::kDouble);
  return net;
}

// ZeRO-1 steps an inner optimizer over slices: the schedule applied to
// shardplan::Optimizer::inner() at 2 and 4 thread ranks trains as one process
// whose Adam gets each step's lr set by hand (1e-12), and not as a
// constant lr would.
TEST(Schedule, ZeroOnesInnerOptimizerTrainsAsOneProcess) {
  const ex::ScheduleSettings cfg = settings(5e-2, 2, 5e-3, 5);
  torch::manual_seed(4);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int i = 0; i < 5; ++i)
    batches.emplace_back(torch::randn({8, 4}, torch::kDouble), torch::randn({8, 2}, torch::kDouble));
  auto train_alone = [&](bool scheduled) {
    auto net = small_net();
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(cfg.lr));
    const ex::Schedule s(cfg);
    for (int k = 1; k <= 5; ++k) {
      if (scheduled) static_cast<torch::optim::AdamOptions&>(adam.param_groups()[0].options()).lr(s.lr_at(k));
      adam.zero_grad();
      torch::mse_loss(net->forward(batches[k - 1].first), batches[k - 1].second).backward();
      adam.step();
    }
    return net;
  };
  const auto want = train_alone(true), constant = train_alone(false);

  for (int world : {2, 4}) {
    SCOPED_TRACE("data ranks " + std::to_string(world));
    std::vector<torch::nn::Sequential> nets;
    for (int r = 0; r < world; ++r) nets.push_back(small_net());
    const auto plan = shardplan::parse_plan("mesh: {data: " + std::to_string(world) +
                                            "}\ndata_parallel: {zero: true, bucket_mb: 0.0001}\nrules: []\n");
    shardplan::run_ranks_in_threads(world, [&](shardplan::World& w) {
      auto& net = nets[w.rank()];
      auto t = shardplan::parallelize_for_training(*net, plan, w);
      ASSERT_TRUE(t.data_parallel->zero());
      shardplan::Optimizer opt(*t.data_parallel, [&](std::vector<torch::Tensor> p) {
        return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(cfg.lr));
      });
      ex::Schedule s(cfg);
      for (int k = 1; k <= 5; ++k) {
        opt.zero_grad();
        torch::mse_loss(net->forward(t.local_batch(batches[k - 1].first)), t.local_batch(batches[k - 1].second))
            .backward();
        s.apply(opt.inner());
        opt.step();
        s.advance();
      }
    });
    for (auto& net : nets) {
      const auto got = net->parameters(), ref = want->parameters(), other = constant->parameters();
      double far = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(torch::allclose(got[i], ref[i], 1e-12, 1e-12)) << "parameter " << i;
        far = std::max(far, (got[i] - other[i]).abs().max().item<double>());
      }
      EXPECT_GT(far, 1e-4);  // the schedule changed the training
    }
  }
}

std::map<std::string, std::string> saved(const ex::Schedule& s, int step) {
  std::map<std::string, std::string> attributes = {{"step", std::to_string(step)}};
  s.save(attributes);
  return attributes;
}

TEST(Schedule, CheckpointAttributesContinueTheSameSequence) {
  ex::Schedule first(settings(0.1, 3, 1e-3, 10));
  for (int k = 0; k < 5; ++k) first.advance();
  const auto attributes = saved(first, 5);
  EXPECT_EQ(attributes.at("schedule"), "--warmup 3 --lr 0.1 --lr-min 0.001 --steps 10");
  EXPECT_EQ(attributes.at("schedule_position"), "5");
  ex::Schedule resumed(settings(0.1, 3, 1e-3, 10));
  resumed.resume(attributes, false, "ckpt");
  EXPECT_EQ(resumed.position(), 5);
  EXPECT_EQ(resumed.next_lr(), first.next_lr());
  // A constant lr writes nothing new: its checkpoints stay as they were.
  EXPECT_EQ(saved(ex::Schedule(settings(0.1, 0)), 5).size(), 1u);
}

std::string resume_error(const std::map<std::string, std::string>& attributes, const ex::ScheduleSettings& now) {
  ex::Schedule s(now);
  try {
    s.resume(attributes, false, "ckpt");
  } catch (const shardplan::Error& e) {
    EXPECT_EQ(s.position(), 0);
    return e.what();
  }
  return "";
}

// Megatron's default: other settings are an error naming both; its
// --override-opt_param-scheduler, ours --override-schedule, goes on with the
// new ones from the saved position.
TEST(Schedule, OtherSettingsOnResumeAreAnErrorUnlessOverridden) {
  ex::Schedule first(settings(0.1, 3, 1e-3, 10));
  for (int k = 0; k < 6; ++k) first.advance();
  const auto attributes = saved(first, 6);
  const std::string tail = ": give the checkpoint's settings to continue its lr sequence, or --override-schedule to "
                           "go on with these from its position 6";
  EXPECT_EQ(resume_error(attributes, settings(0.1, 3, 1e-3, 20)),
            "checkpoint 'ckpt' was trained with --warmup 3 --lr 0.1 --lr-min 0.001 --steps 10, this run asks for "
            "--warmup 3 --lr 0.1 --lr-min 0.001 --steps 20" + tail);
  EXPECT_EQ(resume_error(attributes, settings(0.1, 0)),
            "checkpoint 'ckpt' was trained with --warmup 3 --lr 0.1 --lr-min 0.001 --steps 10, this run asks for "
            "a constant lr (no --warmup, no --lr-min)" + tail);
  for (const auto& other : {settings(0.2, 3, 1e-3, 10), settings(0.1, 2, 1e-3, 10), settings(0.1, 3, 2e-3, 10),
                            settings(0.1, 3)})
    EXPECT_NE(resume_error(attributes, other), "") << other.str();

  ex::Schedule overridden(settings(0.1, 3, 1e-3, 20));
  overridden.resume(attributes, true, "ckpt");
  EXPECT_EQ(overridden.position(), 6);
  EXPECT_DOUBLE_EQ(overridden.next_lr(), ex::Schedule(settings(0.1, 3, 1e-3, 20)).lr_at(7));

  // A checkpoint from before schedules (or a constant run): a constant lr
  // resumes as always, any --lr; a schedule needs the override, from "step".
  const std::map<std::string, std::string> plain = {{"step", "4"}};
  EXPECT_EQ(resume_error(plain, settings(0.5, 0)), "");
  EXPECT_NE(resume_error(plain, settings(0.1, 3, 1e-3, 10)).find("trained with a constant lr"), std::string::npos);
  ex::Schedule from_plain(settings(0.1, 3, 1e-3, 10));
  from_plain.resume(plain, true, "ckpt");
  EXPECT_EQ(from_plain.position(), 4);
}

TEST(Schedule, DamagedAttributesNameTheCheckpoint) {
  const auto s = settings(0.1, 3);
  EXPECT_EQ(resume_error({{"step", "2"}, {"schedule", "--warmup x --lr 0.1"}, {"schedule_position", "2"}}, s),
            "checkpoint 'ckpt': its attribute schedule '--warmup x --lr 0.1' does not read as a schedule");
  EXPECT_EQ(resume_error({{"step", "2"}, {"schedule", "--warmup 3 --lr 0.1 --lr-min 0.01"}, {"schedule_position", "2"}},
                         s),
            "checkpoint 'ckpt': its attribute schedule '--warmup 3 --lr 0.1 --lr-min 0.01' does not read as a "
            "schedule");
  EXPECT_EQ(resume_error({{"step", "2"}, {"schedule", "--warmup 3 --lr 0.1"}, {"schedule_position", "-1"}}, s),
            "checkpoint 'ckpt': its attribute schedule_position '-1' is not a step count");
  EXPECT_EQ(resume_error({{"step", "2"}, {"schedule", "--warmup 3 --lr 0.1"}}, s),
            "checkpoint 'ckpt' records a schedule but no schedule_position");
}

TEST(Schedule, OptionChecks) {
  ex::Args a;
  a.lr = 1e-3;
  a.steps = 10;
  EXPECT_EQ(ex::check_schedule_options(a), "");
  a.warmup = 10;
  EXPECT_EQ(ex::check_schedule_options(a),
            "--warmup 10 leaves no step after it: it must be less than --steps 10");
  a.warmup = 9;
  EXPECT_EQ(ex::check_schedule_options(a), "");
  for (double bad : {-1e-4, 2e-3}) {
    a.lr_min = bad;
    EXPECT_EQ(ex::check_schedule_options(a), "--lr-min " + std::string(bad < 0 ? "-0.0001" : "0.002") +
                                                  " must be from 0 to --lr 0.001");
  }
  a.lr_min = 1e-3;  // equal to --lr: a flat decay, allowed (Megatron's max_lr >= min_lr)
  EXPECT_EQ(ex::check_schedule_options(a), "");
  a.warmup = 0;
  a.steps = 0;
  a.load = "ckpt";
  EXPECT_EQ(ex::check_schedule_options(a), "--lr-min decays over --steps: it needs --steps of at least 1");
  a.lr_min = NAN;
  a.load.clear();
  a.override_schedule = true;
  EXPECT_EQ(ex::check_schedule_options(a), "--override-schedule takes effect with --load DIR or --resume auto only");
  a.resume_auto = true;
  EXPECT_EQ(ex::check_schedule_options(a), "");
  EXPECT_EQ(ex::schedule_settings(a).constant(), true);
}

}  // namespace

}  // namespace test_schedule
