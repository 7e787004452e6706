// What selective recomputation does not redo in backward. Dropout masks
// (shardplan::DropoutMaskScope): a replay gives the recorded run's masks bit
// for bit and leaves the stream where the draw left it, with a tracker and
// with torch's default generator, whatever the stream's state before it;
// recording draws what an unrecorded dropout draws; a replay that asks for
// another mask is one line. The product that ends the region
// (recompute_final_bmm): skipped in the rerun only, the gradients unchanged,
// the determinism check still catching a region that changed.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardplan/error.h"
#include "shardplan/random.h"
#include "shardplan/recompute.h"

namespace test_recompute_selective {

namespace {

using Mode = shardplan::DropoutMaskScope::Mode;

std::shared_ptr<shardplan::RngTracker> tracker() {
  return std::make_shared<shardplan::RngTracker>(11, shardplan::Mesh({{"model", 2}}), 1);
}

bool same_states(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& kv : a)
    if (!b.count(kv.first) || !kv.second.equal(b.at(kv.first))) return false;
  return true;
}

// 3 x 37: the last byte of the bits is partial.
at::Tensor input(at::ScalarType dtype) { return torch::rand({3, 37}, at::TensorOptions(dtype)) + 0.5; }

}  // namespace

TEST(RecomputeMasks, AReplayIsTheRecordedMaskAndLeavesTheStreamAsTheDrawDid) {
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    for (bool fork : {false, true}) {
      const at::Tensor x = input(dtype);
      auto plain = tracker(), taped = tracker();
      at::Tensor y_plain, next_plain, y_rec, next_rec;
      std::map<std::string, at::Tensor> after;
      {
        shardplan::RngTrackerScope scope(plain);
        std::unique_ptr<shardplan::RngFork> f(fork ? new shardplan::RngFork("model") : nullptr);
        y_plain = shardplan::dropout(x, 0.3, true);
        next_plain = shardplan::dropout(x, 0.5, true);
      }
      shardplan::DropoutMasks masks;
      shardplan::RngTrackerScope scope(taped);
      std::unique_ptr<shardplan::RngFork> f(fork ? new shardplan::RngFork("model") : nullptr);
      {
        shardplan::DropoutMaskScope tape(masks, Mode::record);
        y_rec = shardplan::dropout(x, 0.3, true);
      }
      after = taped->get_states();
      EXPECT_TRUE(y_rec.equal(y_plain)) << "recording changed the draw";
      ASSERT_EQ(masks.masks.size(), 1u);
      EXPECT_EQ(masks.masks[0].bits.numel(), (3 * 37 + 7) / 8);
      // Whatever the stream holds now, the replay gives the recorded mask.
      shardplan::dropout(x, 0.5, true);
      at::Tensor y_rep;
      {
        shardplan::DropoutMaskScope tape(masks, Mode::replay);
        y_rep = shardplan::dropout(x, 0.3, true);
      }
      EXPECT_TRUE(y_rep.equal(y_plain)) << dtype << " fork " << fork;
      EXPECT_TRUE(same_states(taped->get_states(), after));
      EXPECT_TRUE(shardplan::dropout(x, 0.5, true).equal(next_plain));
      EXPECT_EQ(masks.next, 1u);
      // In place, from the same bits.
      masks.next = 0;
      at::Tensor z = x.clone();
      {
        shardplan::DropoutMaskScope tape(masks, Mode::replay);
        shardplan::dropout(z, 0.3, true, /*inplace=*/true);
      }
      EXPECT_TRUE(z.equal(y_plain));
    }
  }
}

// Without a tracker dropout is at::dropout (torch's default generator); a
// recorded one draws the same mask from the same generator.
TEST(RecomputeMasks, WithoutATrackerTheDefaultGeneratorReplaysAlike) {
  const at::Tensor x = input(at::kDouble);
  torch::manual_seed(7);
  const at::Tensor y_plain = shardplan::dropout(x, 0.25, true);
  const at::Tensor next_plain = torch::rand({5}, at::kDouble);
  torch::manual_seed(7);
  shardplan::DropoutMasks masks;
  {
    shardplan::DropoutMaskScope tape(masks, Mode::record);
    EXPECT_TRUE(shardplan::dropout(x, 0.25, true).equal(y_plain));
  }
  torch::manual_seed(99);
  {
    shardplan::DropoutMaskScope tape(masks, Mode::replay);
    EXPECT_TRUE(shardplan::dropout(x, 0.25, true).equal(y_plain));
  }
  EXPECT_TRUE(torch::rand({5}, at::kDouble).equal(next_plain));
  // Not training, p = 0: nothing drawn, nothing kept.
  shardplan::DropoutMasks none;
  shardplan::DropoutMaskScope tape(none, Mode::record);
  EXPECT_TRUE(shardplan::dropout(x, 0.25, false).equal(x));
  EXPECT_TRUE(shardplan::dropout(x, 0.0, true).equal(x));
  EXPECT_TRUE(none.masks.empty());
}

TEST(RecomputeMasks, AReplayAskingForAnotherMaskIsOneLine) {
  shardplan::RngTrackerScope scope(tracker());
  shardplan::DropoutMasks masks;
  {
    shardplan::DropoutMaskScope tape(masks, Mode::record);
    shardplan::dropout(input(at::kFloat), 0.3, true);
  }
  shardplan::DropoutMaskScope tape(masks, Mode::replay);
  std::string msg;
  try {
    shardplan::dropout(torch::ones({4, 4}), 0.3, true);
  } catch (const shardplan::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("asked for mask 0 as [4, 4] Float p=0.3, its forward drew [3, 37] Float p=0.3"), std::string::npos)
      << msg;
  masks.next = 1;
  msg.clear();
  try {
    shardplan::dropout(input(at::kFloat), 0.3, true);
  } catch (const shardplan::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("after the 1 its forward drew"), std::string::npos) << msg;
}

// A region keeping its masks replays them in backward: its gradient is the
// one without recomputation, bit for bit; and one whose dropout asks for
// another mask in backward (here its probability changed) stops with the
// replay's line, where a region drawing again would have drawn a new mask.
TEST(RecomputeMasks, ARegionKeepingItsMasksReplaysThemInBackward) {
  shardplan::RngTrackerScope scope(tracker());
  const at::Tensor w = torch::rand({3, 37}, at::kDouble);
  double p = 0.3;
  auto region = [&](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{shardplan::dropout(in[0] * w, p, true).sin()};
  };
  at::Tensor x = input(at::kDouble).requires_grad_(), x2 = x.detach().clone().requires_grad_();
  auto t = shardplan::current_rng_tracker_ptr();
  const auto start = t->get_states();
  region({x2})[0].sum().backward();
  t->set_states(start);
  shardplan::recompute(region, {x}, {}, "region", /*selective=*/true)[0].sum().backward();
  EXPECT_TRUE(x.grad().equal(x2.grad()));
  at::Tensor y = shardplan::recompute(region, {x}, {}, "region", /*selective=*/true)[0];
  p = 0.6;
  std::string msg;
  try {
    y.sum().backward();
  } catch (const std::exception& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("dropout: replaying a recomputed region asked for mask 0 as [3, 37] Double p=0.6"),
            std::string::npos)
      << msg;
}

namespace {

struct ProductRun {
  at::Tensor a_grad, b_grad;
  std::vector<std::string> nodes;  // the product's grad_fn, per run of the region's body
};

// softmax(a) x b through recompute_final_bmm, in a region made by `wrap`.
ProductRun product_run(
    const std::function<at::Tensor(const shardplan::RecomputeFn&, const std::vector<at::Tensor>&)>& wrap) {
  torch::manual_seed(4);
  at::Tensor a = torch::rand({2, 3, 5}, at::kDouble).requires_grad_(),
             b = torch::rand({2, 5, 4}, at::kDouble).requires_grad_();
  const at::Tensor g = torch::rand({2, 3, 4}, at::kDouble);
  ProductRun r;
  const at::Tensor y = wrap(
      [&](const std::vector<at::Tensor>& in) {
        at::Tensor out = shardplan::recompute_final_bmm(in[0].softmax(-1), in[1]);
        r.nodes.push_back(out.grad_fn() ? out.grad_fn()->name() : "-");
        return std::vector<at::Tensor>{out};
      },
      {a, b});
  EXPECT_TRUE(y.equal(at::bmm(a.detach().softmax(-1), b.detach())));
  y.backward(g);
  r.a_grad = a.grad();
  r.b_grad = b.grad();
  return r;
}

}  // namespace

TEST(RecomputeSelective, TheRerunSkipsTheFinalProductOnly) {
  const ProductRun plain =
      product_run([](const shardplan::RecomputeFn& fn, const std::vector<at::Tensor>& in) { return fn(in)[0]; });
  const ProductRun selective = product_run([](const shardplan::RecomputeFn& fn, const std::vector<at::Tensor>& in) {
    return shardplan::recompute(fn, in, {}, "region", /*selective=*/true)[0];
  });
  const ProductRun full = product_run([](const shardplan::RecomputeFn& fn, const std::vector<at::Tensor>& in) {
    return shardplan::recompute(fn, in, {}, "region")[0];
  });
  const ProductRun nested = product_run([](const shardplan::RecomputeFn& fn, const std::vector<at::Tensor>& in) {
    return shardplan::recompute(
        [fn](const std::vector<at::Tensor>& x) { return shardplan::recompute(fn, x, {}, "inner", true); }, in, {},
        "outer")[0];
  });
  EXPECT_EQ(plain.nodes, std::vector<std::string>{"BmmBackward0"});
  ASSERT_EQ(selective.nodes.size(), 2u);  // forward (no graph), rerun
  EXPECT_EQ(selective.nodes[0], "-");
  EXPECT_NE(selective.nodes[1].find("SkippedBmm"), std::string::npos) << selective.nodes[1];
  EXPECT_EQ(full.nodes, (std::vector<std::string>{"-", "BmmBackward0"}));
  EXPECT_EQ(nested.nodes, (std::vector<std::string>{"-", "BmmBackward0"}));
  for (const ProductRun* r : {&selective, &full, &nested}) {
    EXPECT_TRUE(r->a_grad.equal(plain.a_grad));
    EXPECT_TRUE(r->b_grad.equal(plain.b_grad));
  }
}

// With its outputs left uninitialised by the skipped product, a selective
// rerun is checked on a sample of the product's left factor: a region whose
// probabilities changed between forward and backward is still one line.
TEST(RecomputeSelective, ARegionThatChangedIsStillOneLine) {
  double scale = 1;
  at::Tensor a = torch::rand({2, 3, 5}, at::kDouble).requires_grad_(), b = torch::rand({2, 5, 4}, at::kDouble);
  const at::Tensor y = shardplan::recompute(
      [&](const std::vector<at::Tensor>& in) {
        return std::vector<at::Tensor>{shardplan::recompute_final_bmm((in[0] * scale).softmax(-1), in[1])};
      },
      {a, b}, {}, "module 'blocks.0.attn' (Attention)", /*selective=*/true)[0];
  scale = 2;
  std::string msg;
  try {
    y.sum().backward();
  } catch (const std::exception& e) {
    msg = e.what();
  }
  EXPECT_NE(
      msg.find("recompute: module 'blocks.0.attn' (Attention) computed other outputs when recomputed in backward"),
      std::string::npos)
      << msg;
}

}  // namespace test_recompute_selective
