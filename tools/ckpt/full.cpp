// `convert --full`: the archive torch::nn::Module::save would write for the
// unsharded model. Module::save writes its parameters, then its buffers
// (is_buffer), then one nested archive per child module under the child's
// name; Module::load reads them back by the same local names, so a dotted
// state-dict name "blocks.0.fc1.weight" becomes archive "blocks" > "0" >
// "fc1" > tensor "weight".
#include <torch/serialize/output-archive.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "commands.h"
#include "shardplan/checkpoint.h"

namespace shardplan_ckpt {

namespace {

struct Node {
  std::vector<std::pair<std::string, at::Tensor>> params, buffers;
  std::vector<std::pair<std::string, std::unique_ptr<Node>>> children;  // in order of first appearance

  Node& child(const std::string& name) {
    for (auto& c : children)
      if (c.first == name) return *c.second;
    children.emplace_back(name, std::make_unique<Node>());
    return *children.back().second;
  }
  void write(torch::serialize::OutputArchive& archive) const {
    for (const auto& p : params) archive.write(p.first, p.second);
    for (const auto& b : buffers) archive.write(b.first, b.second, /*is_buffer=*/true);
    for (const auto& c : children) {
      torch::serialize::OutputArchive nested(archive.compilation_unit());
      c.second->write(nested);
      archive.write(c.first, nested);
    }
  }
};

}  // namespace

void write_full(const std::string& dir, const std::string& file) {
  std::vector<std::string> buffer_names, modules;
  const shardplan::StateDict state = shardplan::read_checkpoint(dir, &buffer_names, &modules);
  const std::set<std::string> buffers(buffer_names.begin(), buffer_names.end());
  Node root;
  // Module::load wants an archive for every child, parameterless ones too.
  for (const auto& path : modules) {
    Node* node = &root;
    std::string rest = path + ".";
    for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1))
      node = &node->child(rest.substr(0, dot));
  }
  for (const auto& kv : state) {
    Node* node = &root;
    std::string rest = kv.first;
    for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1))
      node = &node->child(rest.substr(0, dot));
    if (buffers.count(kv.first))
      node->buffers.emplace_back(rest, kv.second);
    else
      node->params.emplace_back(rest, kv.second.requires_grad_(true));  // as a parameter is saved
  }
  torch::serialize::OutputArchive archive;
  root.write(archive);
  // Written next to the target and renamed, so FILE is either whole or as it was.
  const std::string tmp = file + ".partial";
  archive.save_to(tmp);
  std::filesystem::rename(tmp, file);
}

}  // namespace shardplan_ckpt
