#include "shardplan/tied.h"

#include <torch/nn/module.h>

#include <unordered_map>
#include <unordered_set>

#include "shardplan/error.h"
#include "base/shape_text.h"

namespace shardplan {

namespace {

// Module::parameters_ is protected; a pointer to it formed through a derived
// class is a pointer to Module's member, usable on any Module.
struct ParameterAccess : torch::nn::Module {
  static torch::OrderedDict<std::string, at::Tensor>& of(torch::nn::Module& m) {
    return m.*(&ParameterAccess::parameters_);
  }
};

}  // namespace

at::Tensor tie_parameter(torch::nn::Module& module, const std::string& name, const at::Tensor& shared) {
  auto& params = ParameterAccess::of(module);
  at::Tensor* p = params.find(name);
  if (!p) throw Error("tie_parameter: module " + module.name() + " has no parameter '" + name + "'");
  if (!shared.defined()) throw Error("tie_parameter: the tensor to tie '" + name + "' to is undefined");
  if (p->defined() && p->sizes() != shared.sizes())
    throw Error("tie_parameter: parameter '" + name + "' of " + module.name() + " has shape " + shape_str(p->sizes()) +
                ", the tensor tied to it " + shape_str(shared.sizes()));
  *p = shared;
  return shared;
}

std::vector<std::vector<std::string>> tied_parameters(const torch::nn::Module& module) {
  std::unordered_map<const void*, size_t> group_of;
  std::vector<std::vector<std::string>> groups;
  for (const auto& p : module.named_parameters()) {
    auto it = group_of.emplace(p.value().unsafeGetTensorImpl(), groups.size());
    if (it.second) groups.emplace_back();
    groups[it.first->second].push_back(p.key());
  }
  std::vector<std::vector<std::string>> out;
  for (auto& g : groups)
    if (g.size() > 1) out.push_back(std::move(g));
  return out;
}

std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module) {
  std::unordered_set<const void*> seen;
  std::vector<at::Tensor> out;
  for (const auto& p : module.parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

}  // namespace shardplan
