#pragma once
// The example's model: two LoRALinear layers around a tanh, the shape of a
// transformer MLP block (fc1 widens, fc2 narrows), as the plans shard it.
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include "lora_linear.h"

namespace lora {

struct TinyLoRAImpl : torch::nn::Cloneable<TinyLoRAImpl> {
  TinyLoRAImpl(int64_t in, int64_t hidden, int64_t out, int64_t r, double alpha)
      : in_(in), hidden_(hidden), out_(out), r_(r), alpha_(alpha) {
    reset();
  }
  void reset() override {
    fc1 = register_module("fc1", LoRALinear(in_, hidden_, r_, alpha_));
    fc2 = register_module("fc2", LoRALinear(hidden_, out_, r_, alpha_));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(fc1(x).tanh()); }
  void merge() {
    fc1->merge();
    fc2->merge();
  }

  LoRALinear fc1{nullptr}, fc2{nullptr};

 private:
  int64_t in_, hidden_, out_, r_;
  double alpha_;
};

TORCH_MODULE(TinyLoRA);

}  // namespace lora
