// The registry of example models (declared in models/model.h).
#include <functional>

#include "models/convnet.h"
#include "models/gpt.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "models/lstm_lm.h"
#include "models/model.h"
#include "shardplan/error.h"

namespace shardplan {
namespace examples {
namespace {

struct Entry {
  const char* name;
  const char* help;
  std::function<std::shared_ptr<torch::nn::Module>(const Overrides&)> make;
};

const std::vector<Entry>& entries() {
  static const std::vector<Entry> all = {
      {"gpt", "GPT-style decoder LM (config: vocab context embed heads layers mlp dropout)",
       [](const Overrides& o) { return GPT(GPTConfig::from(o)).ptr(); }},
      {"convnet",
       "Conv2d classifier on synthetic images (config: channels size conv1 conv2 hidden classes noise task_seed)",
       [](const Overrides& o) { return ConvNet(ConvNetConfig::from(o)).ptr(); }},
      {"lstm_lm", "LSTM language model (config: vocab context embed hidden layers)",
       [](const Overrides& o) { return LSTMLM(LSTMLMConfig::from(o)).ptr(); }},
      {"llama",
       "Llama-family decoder LM, Hugging Face names (config: vocab context embed heads kv_heads layers mlp rope_theta "
       "rms_eps tie family head_dim window; family llama, qwen2, mistral, gemma or phi3, as config.json's model_type)",
       [](const Overrides& o) { return Llama(LlamaConfig::from(o)).ptr(); }},
      {"gpt2",
       "GPT-2, Hugging Face names, lm_head tied to transformer.wte (config: vocab context embed heads layers mlp "
       "ln_eps)",
       [](const Overrides& o) { return GPT2(GPT2Config::from(o)).ptr(); }},
  };
  return all;
}

const Entry& find(const std::string& name) {
  for (const auto& e : entries())
    if (name == e.name) return e;
  std::string names;
  for (const auto& e : entries()) names += (names.empty() ? "" : ", ") + std::string(e.name);
  throw Error("unknown model '" + name + "' (known: " + names + ")");
}

}  // namespace

at::Tensor ExampleModel::output_loss(const at::Tensor&, const at::Tensor&) {
  throw Error("this model does not declare its pieces for a pipeline (shardplan::PipelineModel); gpt does");
}

Overrides parse_overrides(const std::string& text) {
  Overrides out;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(begin, end - begin);
    if (!item.empty()) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0) throw Error("config item '" + item + "' is not key=value");
      out[item.substr(0, eq)] = item.substr(eq + 1);
    }
    begin = end + 1;
  }
  return out;
}

ModelHandle as_example(const std::shared_ptr<torch::nn::Module>& module) {
  ModelHandle h{module, dynamic_cast<ExampleModel*>(module.get())};
  if (!h.model) throw Error("module " + module->name() + " is not an example model");
  return h;
}

ModelHandle make_model(const std::string& name, const Overrides& config) { return as_example(find(name).make(config)); }

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& e : entries()) names.push_back(e.name);
  return names;
}

std::string model_help(const std::string& name) { return find(name).help; }

}  // namespace examples
}  // namespace shardplan
