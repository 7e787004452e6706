// Uses an installed shardplan: plan parsing, a shardable layer, the installed
// dense and local plugins (found relative to the installed library), and a
// 2-rank tensor-parallel forward that must equal the unsharded one.
#include <torch/torch.h>

#include <iostream>

#include "shardplan/nn/linear.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"

int main() {
  auto plan = shardplan::parse_plan("mesh: {model: auto}\nrules:\n  - {match: 'weight', layout: [model, null]}\n");
  torch::manual_seed(0);
  shardplan::nn::Linear reference(4, 6);
  auto x = torch::randn({2, 4});
  auto expected = reference->forward(x);
  std::vector<torch::Tensor> got(2);
  shardplan::run_ranks_in_threads(2, [&](shardplan::World& world) {
    auto layer = std::dynamic_pointer_cast<shardplan::nn::LinearImpl>(reference->clone());
    shardplan::parallelize(*layer, plan, world);
    if (layer->weight.size(0) != 3) throw std::runtime_error("weight not sharded");
    got[world.rank()] = layer->forward(x);
  });
  for (const auto& g : got)
    if (!torch::allclose(g, expected)) {
      std::cerr << "consumer: sharded output differs\n";
      return 1;
    }
  std::cout << "consumer: ok\n";
  return 0;
}
