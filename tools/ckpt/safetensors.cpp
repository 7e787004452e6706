// `convert --to safetensors` and `convert --from safetensors`: sharded
// checkpoints to and from the whole-tensor files Python reads and writes.
#include <torch/torch.h>

#include <memory>
#include <string>

#include "commands.h"
#include "shardplan/checkpoint.h"
#include "shardplan/error.h"
#include "shardplan/weights.h"
#include "shardplan/world.h"

namespace shardplan_ckpt {

namespace {

// A module whose named_parameters() are exactly `state`'s names: one
// submodule per dotted prefix, so save_checkpoint stores them as they are.
struct Bag : torch::nn::Module {
  torch::nn::Module& at(const std::string& path) {
    torch::nn::Module* m = this;
    std::string rest = path;
    for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1)) {
      const std::string name = rest.substr(0, dot);
      auto children = m->named_children();
      if (auto* c = children.find(name)) m = c->get();
      else m = m->register_module(name, std::make_shared<Bag>()).get();
    }
    return *m;
  }
};

std::string leaf(const std::string& path) { return path.substr(path.rfind('.') + 1); }

// Each dotted part of a name becomes a module or parameter name; libtorch
// refuses an empty one with a backtrace, and safetensors allows "encoder.".
void add(Bag& bag, const std::string& name, const at::Tensor& t, const std::string& src) {
  const std::string where = "tensor '" + name + "' in '" + src + "'";
  if (name.empty() || name.front() == '.' || name.back() == '.' || name.find("..") != std::string::npos)
    throw shardplan::Error(where + ": a checkpoint names parameters module.path.leaf, and this name has an empty part");
  try {
    bag.at(name).register_parameter(leaf(name), t, /*requires_grad=*/t.is_floating_point());
  } catch (const c10::Error& e) {  // "a" beside "a.b": one name is a parameter, the other a module
    const std::string why = e.what_without_backtrace();
    throw shardplan::Error(where + ": " + why.substr(0, why.find('\n')));
  }
}

}  // namespace

void checkpoint_to_safetensors(const std::string& dir, const std::string& out) {
  shardplan::write_safetensors(out, shardplan::read_checkpoint(dir));
}

void safetensors_to_checkpoint(const std::string& src, const std::string& dir, int world, const std::string& plan_yaml) {
  auto bag = std::make_shared<Bag>();
  for (const auto& kv : shardplan::read_weights(src)) add(*bag, kv.first, kv.second, src);
  shardplan::run_ranks_in_threads(1, [&](shardplan::World& w) { shardplan::save_checkpoint(dir, *bag, {}, w); });
  if (world > 1 || !plan_yaml.empty()) shardplan::reshard_checkpoint(dir, dir, world, plan_yaml);
}

}  // namespace shardplan_ckpt
