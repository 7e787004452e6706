#include "lora_linear.h"

#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>
#include <torch/serialize.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <ostream>
#include <stdexcept>

#include "shardplan/error.h"

namespace lora {

namespace F = torch::nn::functional;

LoRALinearImpl::LoRALinearImpl(int64_t in, int64_t out, int64_t rank, double alpha_, bool bias_)
    : in_features(in), out_features(out), r(rank), alpha(alpha_), with_bias(bias_) {
  if (r < 1) throw shardplan::Error("LoRALinear: rank r must be >= 1, got " + std::to_string(r));
  reset();
}

void LoRALinearImpl::reset() {
  weight = register_parameter("weight", torch::empty({out_features, in_features}));
  bias = with_bias ? register_parameter("bias", torch::empty({out_features}))
                   : register_parameter("bias", {}, /*requires_grad=*/false);
  lora_A = register_parameter("lora_A", torch::empty({r, in_features}));
  lora_B = register_parameter("lora_B", torch::zeros({out_features, r}));
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
  if (bias.defined()) {
    const double bound = 1 / std::sqrt(static_cast<double>(in_features));
    torch::nn::init::uniform_(bias, -bound, bound);
  }
  torch::nn::init::kaiming_uniform_(lora_A, std::sqrt(5));
}

void LoRALinearImpl::pretty_print(std::ostream& stream) const {
  stream << "lora::LoRALinear(in_features=" << in_features << ", out_features=" << out_features << ", r=" << r
         << ", alpha=" << alpha << (merged_ ? ", merged" : "");
  if (strategy_) stream << ", " << strategy_->describe();
  stream << ")";
}

at::Tensor LoRALinearImpl::forward(const at::Tensor& x) {
  const at::Tensor a = merged_ ? at::Tensor() : lora_A;
  const at::Tensor b = merged_ ? at::Tensor() : lora_B;
  if (strategy_) return strategy_->forward(x, weight, bias, a, b, scale());
  at::Tensor y = F::linear(x, weight, bias);
  return merged_ ? y : y + scale() * F::linear(F::linear(x, a), b);
}

void LoRALinearImpl::merge() {
  if (merged_) return;
  torch::NoGradGuard no_grad;
  weight.add_(torch::matmul(lora_B, lora_A), scale());
  merged_ = true;
}

bool is_adapter(const std::string& path) {
  auto ends_with = [&](const std::string& tail) {
    return path.size() >= tail.size() && path.compare(path.size() - tail.size(), tail.size(), tail) == 0 &&
           (path.size() == tail.size() || path[path.size() - tail.size() - 1] == '.');
  };
  return ends_with("lora_A") || ends_with("lora_B");
}

std::vector<at::Tensor> freeze_base(torch::nn::Module& model) {
  std::vector<at::Tensor> adapters;
  for (auto& p : model.named_parameters()) {
    const bool adapter = is_adapter(p.key());
    p.value().set_requires_grad(adapter);
    if (adapter) adapters.push_back(p.value());
  }
  return adapters;
}

shardplan::StateDict adapter_state_dict(torch::nn::Module& model, const shardplan::ParallelReport& report,
                                        shardplan::World& world, int root) {
  shardplan::StateDict adapters;
  for (auto& kv : shardplan::collect_state_dict(model, report, world, root))
    if (is_adapter(kv.first)) adapters.push_back(std::move(kv));
  return adapters;
}

// A {name: tensor} dict in torch::pickle_save's format, which PyTorch documents
// as readable by Python's torch.load (not checked here: no Python torch).
void save_adapters(const shardplan::StateDict& adapters, const std::string& file) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& kv : adapters) dict.insert(kv.first, kv.second);
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  std::ofstream out(file, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw shardplan::Error("cannot write adapters to '" + file + "'");
}

shardplan::StateDict read_adapters(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw shardplan::Error("cannot read adapters from '" + file + "'");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  shardplan::StateDict adapters;
  for (const auto& kv : torch::pickle_load(bytes).toGenericDict())
    adapters.emplace_back(kv.key().toStringRef(), kv.value().toTensor());
  return adapters;
}

void load_adapters(torch::nn::Module& model, const shardplan::ParallelReport& report,
                   const shardplan::StateDict& adapters) {
  std::map<std::string, at::Tensor> local;
  for (auto& kv : shardplan::relocate_state_dict(adapters, report)) local.emplace(kv.first, kv.second);
  torch::NoGradGuard no_grad;
  for (auto& p : model.named_parameters()) {
    if (!is_adapter(p.key())) continue;
    auto it = local.find(p.key());
    if (it == local.end()) throw shardplan::Error("adapters have no '" + p.key() + "'");
    if (it->second.sizes() != p.value().sizes())
      throw shardplan::Error("adapter '" + p.key() + "' does not fit this model's shard");
    p.value().copy_(it->second);
  }
}

}  // namespace lora
