#pragma once
// The 3-layer MLP the data-parallel and mixed-precision tests train, and
// its tensor-parallel rules (fc1 column-parallel, fc2 row-parallel, fc3
// replicated). Header-only: each test binary's files share it.
#include <torch/torch.h>

#include "shardplan/nn/linear.h"

namespace mlp_model {

inline const char* const kMlpRules = R"(
rules:
  - match: 'fc1\.weight'
    layout: [model, null]
    output: sharded
  - match: 'fc1\.bias'
    layout: [model]
  - match: 'fc2\.weight'
    layout: [null, model]
    input: sharded
)";

struct MlpImpl : torch::nn::Cloneable<MlpImpl> {
  MlpImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", shardplan::nn::Linear(6, 16));
    fc2 = register_module("fc2", shardplan::nn::Linear(16, 8));
    fc3 = register_module("fc3", shardplan::nn::Linear(8, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3->forward(torch::relu(fc2->forward(torch::relu(fc1->forward(x)))));
  }
  // Mean squared error, written out: libtorch 1.13 has no bfloat16 mse_loss on CPU.
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) { return (forward(x) - y).pow(2).mean(); }
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Mlp);

}  // namespace mlp_model
