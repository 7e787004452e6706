#include "models/hf_config_fit.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

#include "models/llama.h"
#include "models/train_checks.h"
#include "shardplan/error.h"
#include "shardplan/weights.h"

namespace shardplan {
namespace examples {
namespace {

struct Fit {
  const std::string& config_path;
  const Overrides& cli;
  const std::string& weights;
  double limit = 0;   // elements one parameter may have
  std::string limit_why;

  // "num_hidden_layers 7" (from the file) or "layers=7 (--config)".
  std::string key(const char* hf, const char* ours, int64_t value) const {
    if (cli.count(ours)) return std::string(ours) + "=" + std::to_string(value) + " (--config)";
    return std::string(hf) + " " + std::to_string(value);
  }
  [[noreturn]] void fail(const std::string& what) const { throw Error("config.json '" + config_path + "': " + what); }
  void parameter(const std::string& keys, const std::string& name, double rows, double cols) const {
    if (rows * cols <= limit) return;
    std::ostringstream s;
    s.precision(0);
    s << std::fixed << keys << ": parameter '" << name << "' would be " << rows << " x " << cols << " = "
      << rows * cols << " elements, more than " << limit_why;
    fail(s.str());
  }
};

// The layer indices the weights' names hold ("...layers.<i>.").
std::set<int64_t> layer_indices(const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes) {
  std::set<int64_t> out;
  for (const auto& t : shapes) {
    const std::string& n = t.first;
    for (size_t at = n.find("layers."); at != std::string::npos; at = n.find("layers.", at + 1)) {
      size_t end = at + 7;
      while (end < n.size() && end - at - 7 < 9 && n[end] >= '0' && n[end] <= '9') ++end;
      const bool whole = at == 0 || n[at - 1] == '.';  // "layers", not "encoder_layers"
      if (whole && end > at + 7 && end < n.size() && n[end] == '.') out.insert(std::atoll(n.c_str() + at + 7));
    }
  }
  return out;
}

void check_layers(const Fit& fit, const LlamaConfig& c, const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes) {
  const std::string key = fit.key("num_hidden_layers", "layers", c.layers);
  const std::set<int64_t> found = layer_indices(shapes);
  if (!found.empty()) {
    if (c.layers == static_cast<int64_t>(found.size()) && *found.rbegin() + 1 == c.layers) return;
    fit.fail(key + " does not match the weights '" + fit.weights + "', whose tensor names hold " +
             std::to_string(found.size()) + " layers (indices " + std::to_string(*found.begin()) + " to " +
             std::to_string(*found.rbegin()) + ")");
  }
  // Names renamed later (--rename-weights): each layer still needs its 9 tensors.
  if (static_cast<double>(c.layers) * 9 > static_cast<double>(shapes.size()))
    fit.fail(key + " needs " + std::to_string(c.layers) + " x 9 tensors, but the weights '" + fit.weights + "' hold " +
             std::to_string(shapes.size()));
}

// vocab_size against the rows of the weights' embedding and head: a
// config.json padded or cut apart from its weights (issue 37) is named
// here, not as a shape mismatch deep in the load.
void check_vocab_rows(const Fit& fit, const LlamaConfig& c,
                      const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes) {
  for (const auto& t : shapes)
    if ((t.first == "model.embed_tokens.weight" || t.first == "lm_head.weight") && t.second.size() == 2 &&
        t.second[0] != c.vocab)
      fit.fail(fit.key("vocab_size", "vocab", c.vocab) + " does not match the weights '" + fit.weights + "', whose " +
               t.first + " has " + std::to_string(t.second[0]) + " rows");
}

}  // namespace

void check_hf_config_fits(const std::string& config_path, const Overrides& config, const Overrides& cli,
                          const std::string& weights, bool strict, int64_t element_size) {
  const LlamaConfig c = LlamaConfig::from(config);  // its own checks first; builds nothing
  Fit fit{config_path, cli, weights};
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  if (strict) {
    shapes = weights_shapes(weights);
    for (const auto& t : shapes) {
      double n = 1;
      for (int64_t d : t.second) n *= static_cast<double>(d);
      fit.limit = std::max(fit.limit, n);
    }
    std::ostringstream s;
    s.precision(0);
    s << std::fixed << "the largest tensor in the weights '" << weights << "' (" << fit.limit << ")";
    fit.limit_why = s.str();
  } else {
    std::string source;
    const int64_t bytes = available_memory_bytes(&source);
    if (bytes < 0) return;
    fit.limit = static_cast<double>(bytes) / static_cast<double>(element_size);
    fit.limit_why = "fit in the memory available (" + std::to_string(bytes) + " bytes, " + source + ")";
  }
  const double e = static_cast<double>(c.embed);
  const std::string hidden = fit.key("hidden_size", "embed", c.embed);
  fit.parameter(fit.key("vocab_size", "vocab", c.vocab) + " and " + hidden, "model.embed_tokens.weight",
                static_cast<double>(c.vocab), e);
  fit.parameter(hidden, "model.layers.0.self_attn.q_proj.weight", static_cast<double>(c.heads * c.head_dim()), e);
  fit.parameter(fit.key("intermediate_size", "mlp", c.mlp) + " and " + hidden, "model.layers.0.mlp.gate_proj.weight",
                static_cast<double>(c.mlp), e);
  if (strict) {
    check_vocab_rows(fit, c, shapes);
    return check_layers(fit, c, shapes);
  }
  // Built in memory: one projection of every layer together ("*": all of them).
  fit.parameter(fit.key("num_hidden_layers", "layers", c.layers) + " and " + hidden,
                "model.layers.*.self_attn.o_proj.weight", static_cast<double>(c.layers), e * e);
}

}  // namespace examples
}  // namespace shardplan
