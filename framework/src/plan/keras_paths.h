#pragma once
// `paths: keras` (docs/PLAN_FORMAT.md, "Keras paths"): the Keras-style name
// and axis order of a torch parameter, so that layout maps written for Keras
// (`dense.*kernel: [null, model]`) apply to torch models unchanged.
#include <cstdint>
#include <string>
#include <vector>

#include "shardplan/plan.h"

namespace shardplan {
namespace detail {

struct KerasName {
  std::string path;           // "block_0/dense/kernel"
  std::vector<int64_t> perm;  // Keras dim j is torch dim perm[j]
};

// `module_type` as parallelize names it ("shardplan::nn::LinearImpl"),
// `module_path` with torch's dots ("block_0.dense"), `param` its local name.
KerasName keras_name(const std::string& module_type, const std::string& module_path, const std::string& param,
                     size_t rank);
// A module path with '/' for '.'.
std::string keras_module_path(const std::string& torch_path);
std::vector<int64_t> permuted(const std::vector<int64_t>& torch_shape, const std::vector<int64_t>& perm);
// A layout written in Keras order, put in torch order.
Layout torch_layout(const Layout& keras_layout, const std::vector<int64_t>& perm);

}  // namespace detail
}  // namespace shardplan
