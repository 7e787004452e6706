#pragma once
// config.json's sizes checked against what can hold them, before any layer
// is built: a num_hidden_layers of 2^31 would otherwise build layers for
// minutes, and a vocab_size of 2^40 fail deep in DeferredInit, naming
// neither the key nor the parameter.
#include <cstdint>
#include <string>

#include "models/model.h"

namespace shardplan {
namespace examples {

// Llama's `config` (config.json at `config_path`, then `cli`, the --config
// overrides, on top) against the weights at `weights`. A strict load takes
// every parameter from one tensor of the weights, so none may have more
// elements than the weights' largest tensor, and the layers must be those
// the weights hold; a lenient one builds the parameters in memory, which
// bounds them instead (`element_size` bytes each). Throws shardplan::Error
// naming the key, where it came from, and the parameter it makes too large.
void check_hf_config_fits(const std::string& config_path, const Overrides& config, const Overrides& cli,
                          const std::string& weights, bool strict, int64_t element_size);

}  // namespace examples
}  // namespace shardplan
