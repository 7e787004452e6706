// shardplan::nn::Linear must be a drop-in for torch::nn::Linear: same
// initialisation, forward, parameter names and checkpoints.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>

#include "shardplan/nn/linear.h"

namespace test_linear {

namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "shardplan_" + name + "_" + std::to_string(::getpid());
}

TEST(Linear, InitialisationAndForwardAreBitIdenticalToTorch) {
  for (bool bias : {true, false}) {
    torch::manual_seed(7);
    torch::nn::Linear ref(torch::nn::LinearOptions(13, 5).bias(bias));
    torch::manual_seed(7);
    shardplan::nn::Linear ours(torch::nn::LinearOptions(13, 5).bias(bias));
    ASSERT_TRUE(torch::equal(ref->weight, ours->weight));
    ASSERT_EQ(ref->bias.defined(), ours->bias.defined());
    if (bias) ASSERT_TRUE(torch::equal(ref->bias, ours->bias));
    auto x = torch::randn({4, 13});
    EXPECT_TRUE(torch::equal(ref->forward(x), ours->forward(x)));
    auto a = ref->named_parameters().keys();
    auto b = ours->named_parameters().keys();
    EXPECT_EQ(a, b);
  }
}

TEST(Linear, VanillaCheckpointLoadsIntoItAndBack) {
  torch::manual_seed(1);
  torch::nn::Sequential vanilla(torch::nn::Linear(6, 4), torch::nn::Functional(torch::relu), torch::nn::Linear(4, 2));
  torch::manual_seed(99);  // different init, so loading must overwrite it
  torch::nn::Sequential ours(shardplan::nn::Linear(6, 4), torch::nn::Functional(torch::relu),
                             shardplan::nn::Linear(4, 2));
  const std::string p1 = temp_path("vanilla.pt"), p2 = temp_path("ours.pt");
  torch::save(vanilla, p1);
  torch::load(ours, p1);
  auto x = torch::randn({3, 6});
  EXPECT_TRUE(torch::equal(vanilla->forward(x), ours->forward(x)));

  torch::manual_seed(5);
  torch::nn::Sequential back(torch::nn::Linear(6, 4), torch::nn::Functional(torch::relu), torch::nn::Linear(4, 2));
  torch::save(ours, p2);
  torch::load(back, p2);
  EXPECT_TRUE(torch::equal(vanilla->forward(x), back->forward(x)));
  std::remove(p1.c_str());
  std::remove(p2.c_str());
}

TEST(Linear, PrettyPrintNamesTheType) {
  std::ostringstream os;
  shardplan::nn::Linear l(3, 2);
  l->pretty_print(os);
  EXPECT_EQ(os.str(), "shardplan::nn::Linear(in_features=3, out_features=2, bias=true)");
}

}  // namespace

}  // namespace test_linear
