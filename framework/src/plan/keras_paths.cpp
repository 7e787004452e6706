#include "keras_paths.h"

#include <algorithm>
#include <numeric>

#include "base/ecma_regex.h"

namespace shardplan {
namespace detail {

namespace {

std::string short_type(const std::string& type) {
  auto colon = type.rfind("::");
  std::string t = colon == std::string::npos ? type : type.substr(colon + 2);
  if (t.size() > 4 && t.compare(t.size() - 4, 4, "Impl") == 0) t.resize(t.size() - 4);
  return t;
}

std::vector<int64_t> identity(size_t rank) {
  std::vector<int64_t> p(rank);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

// torch [out, in, k...] -> Keras [k..., in, out]; a Dense kernel is the
// 2-dim case: [in, out].
std::vector<int64_t> kernel_order(size_t rank) {
  if (rank < 2) return identity(rank);
  std::vector<int64_t> p;
  for (size_t d = 2; d < rank; ++d) p.push_back(static_cast<int64_t>(d));
  p.push_back(1);
  p.push_back(0);
  return p;
}

std::string join(const std::string& module, const std::string& leaf) {
  return module.empty() ? leaf : module + "/" + leaf;
}

}  // namespace

std::string keras_module_path(const std::string& torch_path) {
  std::string p = torch_path;
  std::replace(p.begin(), p.end(), '.', '/');
  return p;
}

KerasName keras_name(const std::string& module_type, const std::string& module_path, const std::string& param,
                     size_t rank) {
  const std::string type = short_type(module_type), module = keras_module_path(module_path);
  if (type == "Linear" || type == "Conv1d" || type == "Conv2d" || type == "Conv3d") {
    if (param == "weight") return {join(module, "kernel"), kernel_order(rank)};
    return {join(module, param), identity(rank)};
  }
  if (type == "Embedding" && param == "weight") return {join(module, "embeddings"), identity(rank)};
  if (type == "LayerNorm" || type == "BatchNorm1d" || type == "BatchNorm2d" || type == "BatchNorm3d" ||
      type == "GroupNorm") {
    if (param == "weight") return {join(module, "gamma"), identity(rank)};
    if (param == "bias") return {join(module, "beta"), identity(rank)};
  }
  if (type == "LSTM" || type == "GRU" || type == "RNN") {
    // weight_ih_l0 -> kernel, weight_hh_l1 -> layer_1/recurrent_kernel,
    // bias_ih_l0_reverse -> backward/bias (Keras's Bidirectional names its
    // second layer backward_...; one prefix keeps the regexes simple).
    static const regex_detail::EcmaRegex gate(R"((weight|bias)_(ih|hh)_l(\d+)(_reverse)?)", 1 << 20);
    std::vector<std::string> m;
    if (gate.full_match(param, &m)) {
      std::string prefix = module;
      if (!m[4].empty()) prefix = join(prefix, "backward");
      if (m[3] != "0") prefix = join(prefix, "layer_" + m[3]);
      const bool weight = m[1] == "weight", input = m[2] == "ih";
      const std::string leaf = weight ? (input ? "kernel" : "recurrent_kernel") : (input ? "bias" : "recurrent_bias");
      return {join(prefix, leaf), weight ? kernel_order(rank) : identity(rank)};
    }
  }
  if (type == "MultiheadAttention") {
    if (param == "in_proj_weight") return {join(module, "in_proj/kernel"), kernel_order(rank)};
    if (param == "in_proj_bias") return {join(module, "in_proj/bias"), identity(rank)};
  }
  return {join(module, param), identity(rank)};
}

std::vector<int64_t> permuted(const std::vector<int64_t>& torch_shape, const std::vector<int64_t>& perm) {
  std::vector<int64_t> out;
  for (int64_t d : perm) out.push_back(torch_shape[static_cast<size_t>(d)]);
  return out;
}

Layout torch_layout(const Layout& keras_layout, const std::vector<int64_t>& perm) {
  if (keras_layout.size() != perm.size()) return keras_layout;  // a rank error, reported by assign()
  Layout out(keras_layout.size());
  for (size_t j = 0; j < perm.size(); ++j) out[static_cast<size_t>(perm[j])] = keras_layout[j];
  return out;
}

}  // namespace detail
}  // namespace shardplan
