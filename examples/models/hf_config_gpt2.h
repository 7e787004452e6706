#pragma once
// GPT-2's config.json (Hugging Face's GPT2Config) read into and written from
// the gpt2 example's overrides (models/gpt2.h), and the names and layout of
// GPT-2's weight files: what `--load-weights DIR` / `--save-weights DIR`
// do for model gpt2. Torch-free.
#include <string>
#include <utility>
#include <vector>

#include "models/hf_config.h"

namespace shardplan {
namespace examples {

// The overrides config.json `path` gives the gpt2 example. A key GPT-2
// needs for its shape (n_embd, n_layer, n_head, n_positions, vocab_size)
// missing, a value of the wrong type, or a setting the example does not
// compute (activation_function other than gelu_new, scale_attn_weights
// false, tie_word_embeddings false, scale_attn_by_inverse_layer_idx,
// reorder_and_upcast_attn, add_cross_attention) is one line naming the file
// and the key.
Overrides read_gpt2_config(const std::string& path);
Overrides read_gpt2_config_text(const std::string& text, const std::string& path);

// GPT2LMHeadModel's config.json for the example's config_str().
std::string gpt2_config_json(const std::string& config_str, const std::string& dtype);

// How GPT-2's files name and lay out the example's tensors: rename rules
// from the file's names (with or without "transformer.") to the model's,
// and the Conv1D weights stored [in, out] (WeightsOptions::transposed over
// the file's names; SaveWeightsOptions::transposed over the model's).
struct GPT2FileLayout {
  std::vector<std::pair<std::string, std::string>> rename;
  std::vector<std::string> load_transposed, save_transposed;
};
GPT2FileLayout gpt2_file_layout();

}  // namespace examples
}  // namespace shardplan
