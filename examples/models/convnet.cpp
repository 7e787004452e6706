#include "models/convnet.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <sstream>

#include "models/config.h"
#include "shardplan/error.h"

namespace shardplan {
namespace examples {

ConvNetConfig ConvNetConfig::from(const Overrides& overrides) {
  ConvNetConfig c;
  ConfigReader r("convnet", overrides);
  r.get("channels", c.channels);
  r.get("size", c.size);
  r.get("conv1", c.conv1);
  r.get("conv2", c.conv2);
  r.get("hidden", c.hidden);
  r.get("classes", c.classes);
  r.get("noise", c.noise);
  r.get("task_seed", c.task_seed);
  r.finish();
  if (c.channels < 1 || c.conv1 < 1 || c.conv2 < 1 || c.hidden < 1 || c.classes < 1)
    throw Error("model 'convnet': channels, conv1, conv2, hidden and classes must be at least 1");
  if (c.size < 2 || c.size % 2 != 0) throw Error("model 'convnet': size must be even and at least 2");
  return c;
}

std::string ConvNetConfig::str() const {
  std::ostringstream s;
  s << "channels=" << channels << " size=" << size << " conv1=" << conv1 << " conv2=" << conv2 << " hidden=" << hidden
    << " classes=" << classes << " noise=" << noise << " task_seed=" << task_seed;
  return s.str();
}

ConvNetImpl::ConvNetImpl(const ConvNetConfig& config_) : config(config_) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(config.task_seed));
  templates = at::randn({config.classes, config.channels, config.size, config.size}, gen, at::kDouble);
  reset();
}

void ConvNetImpl::reset() {
  using torch::nn::Conv2dOptions;
  conv1 = register_module("conv1", shardplan::nn::Conv2d(Conv2dOptions(config.channels, config.conv1, 3).padding(1)));
  conv2 = register_module("conv2", shardplan::nn::Conv2d(Conv2dOptions(config.conv1, config.conv2, 3).padding(1)));
  const int64_t pooled = config.size / 2;
  fc1 = register_module("fc1", shardplan::nn::Linear(config.conv2 * pooled * pooled, config.hidden));
  fc2 = register_module("fc2", shardplan::nn::Linear(config.hidden, config.classes));
  loss_fn = register_module("loss", shardplan::nn::CrossEntropyLoss());
}

at::Tensor ConvNetImpl::forward(const at::Tensor& images) {
  at::Tensor x = at::relu(conv1->forward(images));
  x = at::max_pool2d(at::relu(conv2->forward(x)), {2, 2});
  return fc2->forward(at::relu(fc1->forward(x.flatten(1))));
}

at::Tensor ConvNetImpl::loss(const Batch& batch) { return loss_fn->forward(forward(batch.input), batch.target); }

Batch ConvNetImpl::sample(at::Generator& gen, int64_t batch_size, const Corpus*) const {
  at::Tensor labels = at::randint(config.classes, {batch_size}, gen, at::TensorOptions().dtype(at::kLong));
  at::Tensor images =
      templates.index_select(0, labels) +
      config.noise * at::randn({batch_size, config.channels, config.size, config.size}, gen, at::kDouble);
  return {images.to(conv1->weight.scalar_type()), labels};
}

// plans/convnet.yaml moves, per rank and step (B images of S x S):
//   forward:  conv2's input-channel-parallel all-reduce [B, conv2, S, S];
//             fc2's row-parallel all-reduce [B, classes].
//   backward: fc1's input-gradient all-reduce [B, conv2 * S/2 * S/2].
// conv1 reads the images, which need no gradient, so its column-parallel
// entry has nothing to reduce in backward; conv2 reads conv1's split output
// directly (input: sharded), and fc2 fc1's.
int64_t ConvNetImpl::min_comm_bytes(int64_t batch_size, int world, int64_t element_size) const {
  if (world <= 1) return 0;
  const int64_t s = config.size, p = config.size / 2;
  return batch_size * (config.conv2 * s * s + config.classes + config.conv2 * p * p) * element_size;
}

}  // namespace examples
}  // namespace shardplan
