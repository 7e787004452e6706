#pragma once
// The small Llama the tests train (examples/models/llama.h): its config, the
// shipped plans at its head size, the parity setup that holds a plan to one
// process (tests/parity.h), and auto_plan probed as the trainers probe it.
// Shared by tests/test_llama.cpp (the written plans),
// tests/test_auto_plan_llama.cpp (auto_plan's) and tests/families/.
#include <torch/torch.h>

#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "models/llama.h"
#include "models/model.h"
#include "parity.h"
#include "shardplan/auto_plan.h"
#include "shardplan/plan.h"

namespace llama_fixture {

namespace ex = shardplan::examples;

// head_dim 8, every dim divisible by 4 ranks.
inline ex::Overrides config(int kv_heads) {
  return {{"vocab", "32"}, {"context", "8"}, {"embed", "32"}, {"heads", "4"},
          {"kv_heads", std::to_string(kv_heads)}, {"layers", "2"}, {"mlp", "24"}, {"rope_theta", "500"}};
}

inline std::shared_ptr<ex::LlamaImpl> build(const ex::Overrides& c, torch::Dtype dtype = torch::kDouble) {
  torch::manual_seed(3);
  auto m = std::dynamic_pointer_cast<ex::LlamaImpl>(ex::make_model("llama", c).module);
  m->to(dtype);
  return m;
}

// The shipped plan: as shipped (head_dim: auto, the model's head size) with
// head_dim 0, else with that number written in its place.
inline shardplan::Plan plan(const std::string& name, int64_t head_dim = 0) {
  std::ifstream in(std::string(SHARDPLAN_SOURCE_DIR) + "/plans/" + name + ".yaml");
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  const std::string from = "head_dim: auto", to = "head_dim: " + std::to_string(head_dim);
  for (size_t at = s.find(from); head_dim && at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return shardplan::parse_plan(s, name + ".yaml");
}

// Logits (the vocabulary gathered) and the loss of the vocab-parallel loss.
inline parity::Setup setup(int world, torch::Dtype dtype, int kv_heads) {
  parity::Setup s;
  s.world = world;
  s.dtype = dtype;
  // Three steps: the step-0 gradients agree to 1e-15, and SGD at 0.1 with
  // momentum amplifies rounding a hundredfold per step after the third on
  // this model (2.6e-10 by step 5), which would hide nothing but blur the
  // bound.
  s.steps = 3;
  s.float64_tolerance = 1e-10;
  torch::manual_seed(11);
  for (int step = 0; step < s.steps; ++step) s.inputs.push_back({torch::randint(32, {2, 9}, torch::kLong)});
  s.forward = [](torch::nn::Module& m, const std::vector<torch::Tensor>& in) {
    auto& llama = dynamic_cast<ex::LlamaImpl&>(m);
    const ex::Batch b{in[0].narrow(1, 0, 8), in[0].narrow(1, 1, 8)};
    const torch::Tensor logits = llama.full_logits(llama.forward(b.input));
    return torch::cat({logits.flatten(), llama.loss(b).unsqueeze(0)});
  };
  const bool kv_split = kv_heads % world == 0;
  parity::Shards shards = {{R"(model\.embed_tokens\.weight|lm_head\.weight)", {0, 1}},
                           {R"(.*q_proj\.weight|.*(gate|up)_proj\.weight)", {0, 1}},
                           {R"(.*(o|down)_proj\.weight)", {1, 1}}};
  if (kv_split) shards[R"(.*[kv]_proj\.weight)"] = {0, 1};
  const auto by_rule = parity::local_by(shards);
  // More ranks than kv heads: rank r holds kv head r*kv/world only.
  s.local = [by_rule, kv_split, kv_heads](const std::string& name, const torch::Tensor& full, int rank, int world) {
    static const std::regex kv_proj(R"(.*[kv]_proj\.weight)");
    if (kv_split || !std::regex_match(name, kv_proj)) return by_rule(name, full, rank, world);
    return shardplan::shard_of(full, 0, kv_heads, rank * kv_heads / world);
  };
  return s;
}

// auto_plan probed as train_model --plan auto probes: one training loss.
inline shardplan::Plan auto_plan_of(ex::LlamaImpl& m, int world) {
  torch::manual_seed(4);
  const auto t = torch::randint(32, {2, 9}, torch::kLong);
  const ex::Batch batch{t.narrow(1, 0, 8), t.narrow(1, 1, 8)};
  shardplan::AutoPlanOptions o;
  o.probe = [batch](torch::nn::Module& mod) { return dynamic_cast<ex::LlamaImpl&>(mod).loss(batch); };
  return shardplan::auto_plan(m, world, o);
}

}  // namespace llama_fixture
