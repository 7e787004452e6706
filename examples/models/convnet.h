#pragma once
// A small image classifier built from shardable layers: two 3x3 convolutions
// (the second followed by 2x2 max pooling), a two-layer MLP head and the
// cross-entropy loss as child module "loss". Trained on a synthetic task
// (noisy copies of one random template per class), so nothing is downloaded.
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>

#include "models/model.h"
#include "shardplan/nn/conv.h"
#include "shardplan/nn/cross_entropy.h"
#include "shardplan/nn/linear.h"

namespace shardplan {
namespace examples {

struct ConvNetConfig {
  int64_t channels = 3;
  int64_t size = 16;     // images are size x size (even)
  int64_t conv1 = 32;    // output channels of the first conv
  int64_t conv2 = 64;    // and of the second
  int64_t hidden = 128;  // width of the MLP head
  int64_t classes = 10;
  double noise = 1.0;     // std of the noise around each class template
  int64_t task_seed = 1;  // draws the class templates

  static ConvNetConfig from(const Overrides& overrides);
  std::string str() const;
};

class ConvNetImpl : public torch::nn::Cloneable<ConvNetImpl>, public ExampleModel {
 public:
  explicit ConvNetImpl(const ConvNetConfig& config = {});
  void reset() override;
  // images [B, C, H, W] -> logits [B, classes]
  at::Tensor forward(const at::Tensor& images);

  at::Tensor loss(const Batch& batch) override;
  Batch sample(at::Generator& gen, int64_t batch_size, const Corpus* corpus) const override;
  int64_t items_per_sample() const override { return 1; }
  std::string items_name() const override { return "images"; }
  int64_t min_comm_bytes(int64_t batch_size, int world, int64_t element_size) const override;
  std::string config_str() const override { return config.str(); }

  ConvNetConfig config;
  shardplan::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  shardplan::nn::Linear fc1{nullptr}, fc2{nullptr};
  shardplan::nn::CrossEntropyLoss loss_fn{nullptr};  // registered as "loss"
  // [classes, C, H, W] float64 class templates, drawn from task_seed alone
  // so every rank and clone poses the same task; data, not state, so not a
  // buffer (checkpoints hold the classifier only).
  at::Tensor templates;
};
TORCH_MODULE(ConvNet);

}  // namespace examples
}  // namespace shardplan
