#pragma once
// Tied parameters: one tensor registered in two modules (an LM head sharing
// the token embedding's weight).
//
// In C++ a tie must be the same tensor object in both modules' parameter
// lists and in the typed member forward() reads; `register_parameter` refuses
// an existing name, so tie with:
//
//   head->weight = shardplan::tie_parameter(*head, "weight", embedding->weight);
//
// Module::clone() deep-copies each module on its own, so a clone is untied:
// a model with ties re-ties them after cloning (override clone(), see
// tests/test_tied.cpp). named_parameters() and parameters() list a tied tensor
// once per module (unlike Python's), and torch::optim would then update it
// twice per step: give the optimizer unique_parameters(model).
//
// parallelize() finds ties itself (parameters sharing one tensor) and shards
// the tensor once, so both modules keep sharing this rank's shard; it needs
// both paths planned alike (docs/PLAN_FORMAT.md, "Tied parameters").
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace shardplan {

// Makes `shared` the parameter `name` of `module` (which must have one of the
// same shape) and returns it, to assign to the module's typed member.
at::Tensor tie_parameter(torch::nn::Module& module, const std::string& name, const at::Tensor& shared);

// Groups of named_parameters() keys that are one tensor, each in
// named_parameters() order; parameters used once are left out.
std::vector<std::vector<std::string>> tied_parameters(const torch::nn::Module& module);

// parameters() with every tensor once (first occurrence): what an optimizer
// should get.
std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module);

}  // namespace shardplan
