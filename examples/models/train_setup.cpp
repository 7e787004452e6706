// One rank's model and optimizer before step 1 (models/train_rank.h).
#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <string>

#include "models/families/phi3.h"
#include "models/hf_config.h"
#include "models/hf_config_fit.h"
#include "models/gpt2.h"
#include "models/hf_config_gpt2.h"
#include "models/train_rank.h"
#include "shardplan/auto_plan.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/mixed_precision.h"
#include "shardplan/nn/deferred_init.h"
#include "shardplan/weights.h"

namespace shardplan {
namespace examples {
namespace {

// True when a report layout ("[model, null]", "[null]") names a mesh axis.
bool is_split(const std::string& layout) {
  std::string token;
  for (char c : layout + ",") {
    if (c == '[' || c == ']' || c == ' ') continue;
    if (c == ',') {
      if (!token.empty() && token != "null") return true;
      token.clear();
    } else {
      token += c;
    }
  }
  return false;
}

// --plan auto: shardplan::auto_plan probed with one loss on a batch of 2
// (only its graph matters).
Plan plan_automatically(const TrainRank& r) {
  const Args& a = r.a;
  AutoPlanOptions options;
  options.probe = [&](torch::nn::Module&) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(a.seed);
    return r.m.model->loss(r.m.model->sample(gen, 2, r.corpus));
  };
  Plan plan = auto_plan(*r.m.module, r.world.size(), options);
  if (a.report && r.lead()) std::cout << plan.to_yaml() << std::flush;
  if (r.lead() && plan.rules.empty())
    std::fprintf(stderr,
                 "warning: auto_plan found nothing to shard in model %s: every rank computes all of it (--report "
                 "says why)\n",
                 a.model.c_str());
  return plan;
}

// --load-weights, before any optimizer copies the parameters (ZeRO-1 keeps
// slices of them): each rank reads its shards only; with `dp` (ZeRO-3) only
// its slices of them.
void load_pretrained(const TrainRank& r, DataParallel* dp) {
  const Args& a = r.a;
  WeightsOptions options;
  if (a.model == "gpt2") {  // GPT-2's own names and Conv1D layout, then the user's renames
    const GPT2FileLayout layout = gpt2_file_layout();
    options.rename = layout.rename;
    options.transposed = layout.load_transposed;
  }
  options.rename.insert(options.rename.end(), a.rename_weights.begin(), a.rename_weights.end());
  options.strict = !a.lenient_weights;
  if (const LlamaConfig* phi3 = phi3_config_of(*r.m.module)) options.fused = phi3_load_fused(*phi3);
  const WeightsReport w = dp ? load_weights(*dp, *r.m.module, r.report, a.load_weights, options)
                             : load_weights(*r.m.module, r.report, a.load_weights, options);
  if (!r.lead()) return;
  for (const auto& warning : w.warnings) std::printf("warning: %s\n", warning.c_str());
  std::printf("loaded %zu tensors from %s (rank 0 copied %lld bytes of its shards%s)\n", w.loaded.size(),
              a.load_weights.c_str(), static_cast<long long>(w.bytes_copied),
              dp && dp->zero_stage() == 3 ? ", into its ZeRO-3 slices" : "");
}

}  // namespace

std::mutex& model_init_mutex() {
  static std::mutex mu;
  return mu;
}

Overrides model_config(const Args& a) {
  Overrides config;
  const std::string json = a.load_weights.empty() ? "" : find_hf_config(a.load_weights);
  // A model without a Hugging Face twin (convnet) ignores one; the examples
  // with one are named as the model_type they compute (llama, gpt2).
  const bool twin = !json.empty() && hf_example_for(a.model) == a.model;
  if (twin) config = read_hf_config(json, a.model);
  if (twin && a.model == "gpt2" && gpt2_weights_have_attn_buffers(a.load_weights))
    config["attn_buffers"] = "1";  // older files' attention buffers: loaded, not refused as unknown
  const Overrides cli = parse_overrides(a.config);
  for (const auto& [key, value] : cli) config[key] = value;
  if (twin && a.model == "llama")
    check_hf_config_fits(json, config, cli, a.load_weights, !a.lenient_weights, dtype_bytes(a.dtype));
  return config;
}

void build_sharded_model(TrainRank& r, const std::string& threads) {
  const Args& a = r.a;
  {
    std::lock_guard<std::mutex> lock(model_init_mutex());
    torch::manual_seed(a.seed);
    // Weights from a file replace every parameter: build them without
    // memory, so each rank holds only its shards (a model larger than one
    // rank's memory loads under tensor parallelism). A lenient load keeps
    // the initial values of what the file lacks, so it builds them.
    std::optional<nn::DeferredInit> deferred;
    if (!a.load_weights.empty() && !a.lenient_weights) deferred.emplace(r.dtype);
    r.m = make_model(a.model, model_config(a));
  }
  r.m.module->to(r.dtype);
  int64_t params = 0;
  for (const auto& p : r.m.module->parameters()) params += p.numel();
  if (r.lead())
    std::printf("model %s: %s; %lld parameters; threads %s\n", a.model.c_str(), r.m.model->config_str().c_str(),
                static_cast<long long>(params), threads.c_str());
  if (!a.plan.empty()) {
    r.plan = a.plan == "auto" ? plan_automatically(r) : load_plan(a.plan);
    r.report = parallelize(*r.m.module, r.plan, r.world);
    if (r.lead()) {
      std::printf("plan %s: mesh %s over %d ranks\n", a.plan.c_str(), r.report.mesh.str().c_str(), r.world.size());
      // What the plan's recompute: named, so a run says it recomputes.
      std::map<std::string, int> modes;
      for (const auto& rc : r.report.recompute) ++modes[rc.mode];
      for (const auto& [mode, n] : modes) std::printf("recompute %s: %d modules\n", mode.c_str(), n);
    }
    if (a.report && r.lead()) std::cout << r.report.table() << std::flush;
  } else if (r.world.size() > 1) {
    throw Error("several ranks but no --plan: every rank would train the whole model alone");
  }
  if (!a.load_weights.empty() && !loads_into_slices(r))
    reporting_memory(r.world, r.ranks_in_process, "at load", [&] { load_pretrained(r, nullptr); });
}

bool loads_into_slices(const TrainRank& r) { return !r.a.load_weights.empty() && r.plan.data_parallel.zero == 3; }

void load_into_slices(const TrainRank& r, DataParallel& dp) {
  if (loads_into_slices(r))
    reporting_memory(r.world, r.ranks_in_process, "at load", [&] { load_pretrained(r, &dp); });
}

void check_data_parallel(const TrainRank& r, const DataParallel& dp) {
  const Args& a = r.a;
  if (a.batch % (dp.size() * a.micro_batches) != 0)
    throw Error("--batch " + std::to_string(a.batch) + " (the global batch) does not divide into " +
                std::to_string(dp.size()) + " data rank(s) x " + std::to_string(a.micro_batches) +
                " micro-batch(es)");
  if (!r.lead()) return;
  for (const auto& w : dp.warnings()) std::printf("warning: %s\n", w.c_str());
  if (dp.size() > 1) std::printf("%s", dp.describe().c_str());
}

// Parameter bytes: held vs. what the plan promises (replicated tensors
// whole, split ones divided by the ranks of a model replica). Dividing by
// the world size over the batch axis assumes the examples' plans, which
// split over every other axis.
void print_parameter_bytes(const TrainRank& r, int data_ranks) {
  int64_t held = 0;
  for (const auto& p : r.m.module->parameters()) held += p.numel() * p.element_size();
  int64_t replicated = held, sharded = 0;
  if (!r.a.plan.empty()) {
    replicated = 0;
    for (const auto& row : r.report.rows) {
      if (row.global_shape.empty() && row.element_size == 0) continue;  // a module row (the loss)
      int64_t n = row.element_size;
      for (auto d : row.global_shape) n *= d;
      (is_split(row.layout) ? sharded : replicated) += n;
    }
  }
  in_rank_order(r.world, [&] {
    std::printf("rank %d: parameter bytes %lld = replicated %lld + sharded %lld / %d (unsharded %lld)\n",
                r.world.rank(), static_cast<long long>(held), static_cast<long long>(replicated),
                static_cast<long long>(sharded), r.world.size() / data_ranks,
                static_cast<long long>(replicated + sharded));
  });
}

std::unique_ptr<Optimizer> make_optimizer(const Args& a, DataParallel& dp) {
  // --dtype bfloat16/float16: master weights unless --master is --dtype.
  MixedPrecision mixed;
  if (!a.master.empty()) mixed.master_dtype = dtype_from_name(a.master, "--master");
  if (a.loss_scale) mixed.loss_scaler = LossScalerOptions{};
  auto make = [&a](std::vector<at::Tensor> params) { return make_torch_optimizer(a, std::move(params)); };
  return std::make_unique<Optimizer>(dp, make, mixed);
}

std::unique_ptr<torch::optim::Optimizer> make_torch_optimizer(const Args& a, std::vector<at::Tensor> params) {
  namespace optim = torch::optim;
  if (a.optimizer == "adam") return std::make_unique<optim::Adam>(params, optim::AdamOptions(a.lr));
  if (a.optimizer == "adamw") return std::make_unique<optim::AdamW>(params, optim::AdamWOptions(a.lr));
  if (a.optimizer == "rmsprop") return std::make_unique<optim::RMSprop>(params, optim::RMSpropOptions(a.lr));
  if (a.optimizer == "adagrad") return std::make_unique<optim::Adagrad>(params, optim::AdagradOptions(a.lr));
  return std::make_unique<optim::SGD>(params, optim::SGDOptions(a.lr).momentum(0.9));
}

}  // namespace examples
}  // namespace shardplan
