#include "models/train_loop.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "models/checkpoint_history.h"
#include "models/corpus.h"
#include "models/generate.h"
#include "models/heap.h"
#include "models/hf_config.h"
#include "models/hf_config_fit.h"
#include "models/memory.h"
#include "models/model.h"
#include "models/ranks.h"
#include "models/schedule.h"
#include "models/train_args.h"
#include "models/train_checks.h"
#include "shardplan/auto_plan.h"
#include "shardplan/checkpoint.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/mappings.h"
#include "shardplan/nn/deferred_init.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/random.h"
#include "shardplan/tied.h"
#include "shardplan/weights.h"
#include "shardplan/world.h"
#include "shardplan/zero_optimizer.h"

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

std::string stem(const std::string& path) {
  std::string base = path.substr(path.find_last_of('/') + 1);
  return base.substr(0, base.find('.'));
}

// Prints fn(rank) on each rank in rank order (the barriers are collectives,
// so call it outside the measured steps).
template <class F>
void in_rank_order(World& world, F fn) {
  for (int r = 0; r < world.size(); ++r) {
    if (r == world.rank()) {
      fn();
      std::fflush(stdout);
    }
    world.comm().barrier();
  }
}

// SHARDPLAN_REPORT_MEMORY=1 (a benchmark switch, models/memory.h): runs fn and
// prints each process's resident memory before it, its peak during it and
// after it. Thread ranks share a process: one line for all of them.
template <class F>
void reporting_memory(World& world, int ranks_in_process, const char* what, F fn) {
  if (!memory_report_requested()) return fn();
  const ProcessMemory before = process_memory();
  bool reset = false;
  const ProcessMemory after = peak_during(world, ranks_in_process, fn, &reset);
  const std::string who = ranks_in_process > 1
                              ? "ranks 0-" + std::to_string(world.size() - 1) + " (threads of one process)"
                              : "rank " + std::to_string(world.rank());
  auto line = [&] {
    std::printf("%s: memory %s: RSS %s MiB before (peak since start %s), peak %s during%s, %s after\n", who.c_str(),
                what, mib(before.rss).c_str(), mib(before.peak).c_str(), mib(after.peak).c_str(),
                reset ? "" : " (since start: no reset)", mib(after.rss).c_str());
  };
  if (ranks_in_process > 1) {
    if (world.rank() == 0) line();
    std::fflush(stdout);
  } else {
    in_rank_order(world, line);
  }
}

std::unique_ptr<torch::optim::Optimizer> make_torch_optimizer(const Args& a, std::vector<at::Tensor> params) {
  namespace optim = torch::optim;
  if (a.optimizer == "adam") return std::make_unique<optim::Adam>(params, optim::AdamOptions(a.lr));
  if (a.optimizer == "adamw") return std::make_unique<optim::AdamW>(params, optim::AdamWOptions(a.lr));
  if (a.optimizer == "rmsprop") return std::make_unique<optim::RMSprop>(params, optim::RMSpropOptions(a.lr));
  if (a.optimizer == "adagrad") return std::make_unique<optim::Adagrad>(params, optim::AdagradOptions(a.lr));
  return std::make_unique<optim::SGD>(params, optim::SGDOptions(a.lr).momentum(0.9));
}

// `plan` and `mesh` are empty when unsharded.
GenerateOptions generate_options(const Args& a, const Plan& plan = {}, const Mesh& mesh = {}) {
  GenerateOptions o;
  o.new_tokens = a.generate;
  o.temperature = a.temperature;
  o.top_k = a.top_k;
  const std::string axis = plan.sequence_parallel.enabled ? plan.sequence_axis() : "";
  if (!axis.empty()) o.sequence_parts = mesh.axis_size(axis);
  return o;
}

// Before step 1: what --generate allocates (every rank's key/value caches
// for the whole context, and the prompt's logits over the whole vocabulary)
// must fit this machine, or a finished training would end in a failed
// allocation. `ranks_here`: the ranks sharing this machine's memory.
void check_generation_fits(const Args& a, torch::nn::Module& module, int ranks_here) {
  auto* lm = dynamic_cast<CausalLM*>(&module);
  if (a.generate == 0 || !lm) return;
  const double esize = module.parameters().empty() ? 4 : module.parameters()[0].element_size();
  const double cache = static_cast<double>(lm->cache_bytes(1).this_rank) * a.samples;
  const double logits = static_cast<double>(a.prompt.size()) * a.samples * lm->vocab_size() * esize;
  check_memory("--samples " + std::to_string(a.samples), "generation (key/value caches and the prompt's logits)",
               cache + logits, ranks_here);
}

// After training: samples from the prompt, every rank generating the same
// text (examples/models/generate.h), with each rank's cache bytes and the
// generation's tokens/s.
void generate_text(const Args& a, World& world, torch::nn::Module& module, const Plan& plan,
                   const ParallelReport& report) {
  auto* lm = dynamic_cast<CausalLM*>(&module);
  if (!lm) throw Error("--generate needs a language model (gpt, llama)");
  const GenerateOptions o = generate_options(a, plan, report.mesh);
  // A fresh replicated stream, seeded alike on every rank and in an unsharded
  // run: the same seed samples the same text at any number of ranks, however
  // many draws training made.
  auto tracker = manual_seed(world, a.seed + 2, a.plan.empty() ? Mesh() : report.mesh);
  const at::Tensor prompt = encode(a.prompt).repeat({a.samples, 1});
  const Generation g = generate(*lm, prompt, o, tracker->replicated(), &world.comm());
  const bool lead = world.rank() == 0;
  if (lead) {
    std::printf("generate: %d sample(s) of %d tokens after the prompt \"%s\" (%lld tokens), ", a.samples, a.generate,
                printable(a.prompt).c_str(), static_cast<long long>(prompt.size(1)));
    if (o.temperature == 0 || o.top_k == 1)
      std::printf("greedy\n");
    else
      std::printf("temperature %g, top-k %d\n", o.temperature, a.top_k);
    for (int i = 0; i < a.samples; ++i)
      std::printf("sample %d: \"%s|%s\"\n", i + 1, printable(a.prompt).c_str(),
                  printable(decode(g.tokens[i])).c_str());
  }
  // Every kv head's keys and values for the whole context, in the model's
  // dtype; replicated kv heads (fewer than ranks) count once per rank.
  const int64_t unsharded = lm->cache_bytes(a.samples).unsharded;
  in_rank_order(world, [&] {
    std::printf("rank %d: key/value cache bytes %lld (unsharded %lld, ratio 1/%.4g)\n", world.rank(),
                static_cast<long long>(g.cache_bytes), static_cast<long long>(unsharded),
                g.cache_bytes > 0 ? static_cast<double>(unsharded) / g.cache_bytes : 0.0);
  });
  if (lead)
    std::printf("generated %lld tokens in %.3f s: %.0f tokens/s (batch %d, prefill of %lld + %d steps)\n",
                static_cast<long long>(g.tokens.numel()), g.seconds, g.tokens_per_second(), a.samples,
                static_cast<long long>(prompt.size(1)), a.generate - 1);
  if (lead)
    std::printf("prefill %d x %lld tokens in %.3f s: %.0f tokens/s; decode %d x %d tokens in %.3f s: %.0f tokens/s\n",
                a.samples, static_cast<long long>(prompt.size(1)), g.prefill_seconds, g.prefill_tokens_per_second(),
                a.samples, a.generate - 1, g.seconds - g.prefill_seconds, g.decode_tokens_per_second());
  std::fflush(stdout);
}

// --dump-logits: one forward over the prompt (batch 1) through fresh caches,
// as generation's prefill runs it, so CausalLM::forward_cached gathers a
// vocab-parallel head's slices and every rank holds [T, 1, V] whole. Under
// sequence parallelism the prompt stays split when it divides over the
// ranks, as generate() prefills it, else runs whole. Rank 0 writes it.
void dump_prompt_logits(const Args& a, World& world, torch::nn::Module& module, const Plan& plan,
                        const ParallelReport& report) {
  auto& lm = dynamic_cast<CausalLM&>(module);
  const int64_t parts = generate_options(a, plan, report.mesh).sequence_parts;
  const at::Tensor prompt = encode(a.prompt);
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    const bool was_training = module.is_training();
    module.eval();
    std::optional<WholeSequence> whole;
    if (parts > 1 && prompt.size(1) % parts != 0) whole.emplace();
    auto caches = lm.make_caches();
    logits = lm.forward_cached(prompt, caches).select(1, 0).contiguous();  // [T, V]
    module.train(was_training);
  }
  if (world.rank() != 0) return;
  write_safetensors(a.dump_logits, {{"logits", logits}});
  std::printf("wrote the prompt's logits [%lld, %lld] (%s) to %s\n", static_cast<long long>(logits.size(0)),
              static_cast<long long>(logits.size(1)), a.dtype.c_str(), a.dump_logits.c_str());
}

// What a failure after the last step says about the model it trained.
std::string model_whereabouts(const Args& a, int start) {
  if (start > a.steps)
    return "no step was trained: the model is the one in " + (a.load.empty() ? "--load-weights " + a.load_weights
                                                                             : "--load " + a.load);
  if (!a.save.empty())
    return "the trained model is saved in " + a.save + " at step " + std::to_string(a.steps) + ": rerun with --load " +
           a.save + " --steps " + std::to_string(a.steps) + " to go on from it without training again";
  return "the " + std::to_string(a.steps - start + 1) +
         " trained steps are lost: rerun with --save DIR to keep the model, then --load DIR to go on from it";
}

// Test hook (tests/e2e_models.cmake): SHARDPLAN_TEST_FAIL_AFTER_TRAINING=1
// fails right after the last step, as an unforeseen error there would.
void test_fail_after_training() {
  const char* env = std::getenv("SHARDPLAN_TEST_FAIL_AFTER_TRAINING");
  if (!env || !*env || std::string(env) == "0") return;
  if (std::string(env) != "1")
    throw Error(std::string("SHARDPLAN_TEST_FAIL_AFTER_TRAINING='") + env + "' is not one of: 0, 1");
  throw Error("SHARDPLAN_TEST_FAIL_AFTER_TRAINING=1 (a test hook)");
}

// The model's config: config.json beside --load-weights (llama), then
// --config on top of it.
Overrides model_config(const Args& a) {
  Overrides config;
  const std::string json = a.load_weights.empty() ? "" : find_hf_config(a.load_weights);
  if (!json.empty() && a.model == "llama") config = read_hf_config(json, a.model);
  const Overrides cli = parse_overrides(a.config);
  for (const auto& [key, value] : cli) config[key] = value;
  if (!json.empty() && a.model == "llama")
    check_hf_config_fits(json, config, cli, a.load_weights, !a.lenient_weights, a.dtype == "float64" ? 8 : 4);
  return config;
}

// --load-weights, before any optimizer copies the parameters (ZeRO-1 keeps
// slices of them): each rank reads its shards only.
void load_pretrained(const Args& a, torch::nn::Module& model, const ParallelReport& report, bool lead) {
  WeightsOptions options;
  options.rename = a.rename_weights;
  options.strict = !a.lenient_weights;
  const WeightsReport r = load_weights(model, report, a.load_weights, options);
  if (!lead) return;
  for (const auto& w : r.warnings) std::printf("warning: %s\n", w.c_str());
  std::printf("loaded %zu tensors from %s (rank 0 copied %lld bytes of its shards)\n", r.loaded.size(),
              a.load_weights.c_str(), static_cast<long long>(r.bytes_copied));
}

// --save-weights: whole tensors as safetensors, and for llama the
// config.json transformers needs beside them (written by rank 0 after the
// tensors, replaced in one rename).
void save_pretrained(const Args& a, World& world, torch::nn::Module& model, const ParallelReport& report,
                     const ExampleModel& example) {
  save_weights_safetensors(model, report, world, a.save_weights);
  const std::string json = hf_config_json(a.model, example.config_str(), a.dtype);
  if (world.rank() == 0 && !json.empty()) {
    namespace fs = std::filesystem;
    const fs::path target(a.save_weights);
    const fs::path dir = target.extension() == ".safetensors" ? target.parent_path() : target;
    const fs::path tmp = dir / "config.json.partial";
    {
      std::ofstream out(tmp);
      out << json;
      if (!out.flush()) throw Error("--save-weights: cannot write " + tmp.string());
    }
    fs::rename(tmp, dir / "config.json");
  }
  if (world.rank() == 0) std::printf("saved weights to %s\n", a.save_weights.c_str());
}

// Ranks that are threads share torch's global generator: build models one at
// a time from the same seed so every rank starts from the same weights.
std::mutex init_mutex;

// --plan auto: shardplan::auto_plan probed with one loss on a batch of 2
// (only its graph matters).
Plan plan_automatically(const Args& a, const ModelHandle& m, const Corpus* corpus, int world_size, bool lead) {
  AutoPlanOptions options;
  options.probe = [&](torch::nn::Module&) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(a.seed);
    return m.model->loss(m.model->sample(gen, 2, corpus));
  };
  Plan plan = auto_plan(*m.module, world_size, options);
  if (a.report && lead) std::cout << plan.to_yaml() << std::flush;
  if (lead && plan.rules.empty())
    std::fprintf(stderr,
                 "warning: auto_plan found nothing to shard in model %s: every rank computes all of it (--report "
                 "says why)\n",
                 a.model.c_str());
  return plan;
}

void train(const Args& a, World& world, const Corpus* corpus, int ranks_in_process) {
  // The world already chose the default; intra-op threads are a per-thread
  // setting, so each rank sets its own.
  const ThreadSettings threads =
      a.threads > 0 ? set_num_threads(a.threads, world.options().local_world_size, ranks_in_process) : world.threads();
  const auto dtype = a.dtype == "float64" ? torch::kDouble : torch::kFloat;
  const int64_t esize = a.dtype == "float64" ? 8 : 4;
  ModelHandle m;
  {
    std::lock_guard<std::mutex> lock(init_mutex);
    torch::manual_seed(a.seed);
    // Weights from a file replace every parameter: build them without
    // memory, so each rank holds only its shards (a model larger than one
    // rank's memory loads under tensor parallelism). A lenient load keeps
    // the initial values of what the file lacks, so it builds them.
    std::optional<nn::DeferredInit> deferred;
    if (!a.load_weights.empty() && !a.lenient_weights) deferred.emplace(dtype);
    m = make_model(a.model, model_config(a));
  }
  m.module->to(dtype);
  const bool lead = world.rank() == 0;
  int64_t params = 0;
  for (const auto& p : m.module->parameters()) params += p.numel();
  if (lead)
    std::printf("model %s: %s; %lld parameters; threads %s\n", a.model.c_str(), m.model->config_str().c_str(),
                static_cast<long long>(params), threads.str().c_str());

  ParallelReport report;
  Plan plan;
  if (!a.plan.empty()) {
    plan = a.plan == "auto" ? plan_automatically(a, m, corpus, world.size(), lead) : load_plan(a.plan);
    report = parallelize(*m.module, plan, world);
    if (lead) std::printf("plan %s: mesh %s over %d ranks\n", a.plan.c_str(), report.mesh.str().c_str(), world.size());
    if (a.report && lead) std::cout << report.table() << std::flush;
  } else if (world.size() > 1) {
    throw Error("several ranks but no --plan: every rank would train the whole model alone");
  }
  if (!a.load_weights.empty())
    reporting_memory(world, ranks_in_process, "at load", [&] { load_pretrained(a, *m.module, report, lead); });
  // Gradients averaged over the plan's batch axis, if it has one.
  DataParallel dp(*m.module, report, plan, world);
  if (a.batch % (dp.size() * a.micro_batches) != 0)
    throw Error("--batch " + std::to_string(a.batch) + " (the global batch) does not divide into " +
                std::to_string(dp.size()) + " data rank(s) x " + std::to_string(a.micro_batches) +
                " micro-batch(es)");
  if (lead) {
    for (const auto& w : dp.warnings()) std::printf("warning: %s\n", w.c_str());
    if (dp.size() > 1) std::printf("%s", dp.describe().c_str());
  }
  check_generation_fits(a, *m.module, std::max(ranks_in_process, world.options().local_world_size));

  // Parameter bytes: held vs. what the plan promises (replicated tensors
  // whole, split ones divided by the ranks of a model replica). Dividing by
  // the world size over the batch axis assumes the examples' plans, which
  // split over every other axis.
  int64_t held = 0;
  for (const auto& p : m.module->parameters()) held += p.numel() * p.element_size();
  int64_t replicated = held, sharded = 0;
  if (!a.plan.empty()) {
    replicated = 0;
    for (const auto& row : report.rows) {
      if (row.global_shape.empty() && row.element_size == 0) continue;  // a module row (the loss)
      int64_t n = row.element_size;
      for (auto d : row.global_shape) n *= d;
      (is_split(row.layout) ? sharded : replicated) += n;
    }
  }
  in_rank_order(world, [&] {
    std::printf("rank %d: parameter bytes %lld = replicated %lld + sharded %lld / %d (unsharded %lld)\n", world.rank(),
                static_cast<long long>(held), static_cast<long long>(replicated), static_cast<long long>(sharded),
                world.size() / dp.size(), static_cast<long long>(replicated + sharded));
  });

  auto make_optimizer = [&](std::vector<at::Tensor> params) { return make_torch_optimizer(a, std::move(params)); };
  std::unique_ptr<torch::optim::Optimizer> opt;
  std::unique_ptr<ZeroOptimizer> zero;
  if (dp.zero())
    zero = std::make_unique<ZeroOptimizer>(dp, make_optimizer);
  else
    opt = make_optimizer(unique_parameters(*m.module));
  Schedule schedule(schedule_settings(a));

  // The same data stream on every rank.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(a.seed + 1);

  // Resuming: the model and optimizer from the checkpoint (resharded to this
  // plan and world), and the data stream advanced past the steps it saw.
  // --resume auto takes the newest of --save's checkpoints that loads.
  int start = 1;
  CheckpointHistory history(a.save, a.keep);
  auto load = [&](const std::string& dir) {
    CheckpointOptions o;
    o.optimizer = opt.get();
    o.zero = zero.get();
    return load_checkpoint(dir, *m.module, report, world, o);
  };
  std::string from = a.load;
  std::optional<CheckpointHistory::Attributes> attributes;
  if (a.resume_auto)
    attributes = history.resume(world, load, &from);
  else if (!a.load.empty())
    attributes = load(a.load);
  if (attributes) {
    const auto it = attributes->find("step");
    if (it == attributes->end()) throw Error("checkpoint '" + from + "' records no step");
    start = std::stoi(it->second) + 1;
    if (start <= a.steps) schedule.resume(*attributes, a.override_schedule, from);  // else no lr is used
    for (int s = 1; s < start; ++s) m.model->sample(gen, a.batch, corpus);
    if (lead) std::printf("resumed from %s at step %d\n", from.c_str(), start - 1);
  }
  auto save = [&](int step) {
    CheckpointOptions o;
    o.optimizer = opt.get();
    o.zero = zero.get();
    o.attributes = {{"step", std::to_string(step)}, {"model", a.model}, {"config", m.model->config_str()}};
    schedule.save(o.attributes);
    history.save(world, step, [&](const std::string& dir) { save_checkpoint(dir, *m.module, report, world, o); });
    if (lead) std::printf("saved %s at step %d\n", a.save.c_str(), step);
  };
  const int64_t items = a.batch * m.model->items_per_sample();
  // The model states its minimum for its own plan only.
  const bool own_plan = stem(a.plan) == a.model;
  const int64_t minimum = own_plan ? m.model->min_comm_bytes(a.batch, world.size(), esize) : -1;

  m.module->train();
  world.reset_stats();
  CommStats first;
  auto since = std::chrono::steady_clock::now();
  int since_step = start - 1;
  double loss_sum = 0;
  for (int step = start; step <= a.steps; ++step) {
    // Every rank draws the global batch and trains on its data rank's slice,
    // in micro-batches; the printed loss is the global batch's mean.
    Batch batch = m.model->sample(gen, a.batch, corpus);
    if (batch.input.is_floating_point()) batch.input = batch.input.to(dtype);
    const at::Tensor input = dp.local_batch(batch.input), target = dp.local_batch(batch.target);
    const int64_t micro = input.size(0) / a.micro_batches;
    zero ? zero->zero_grad() : opt->zero_grad();
    double local_loss = 0;
    for (int k = 0; k < a.micro_batches; ++k) {
      Batch mb{input.narrow(0, k * micro, micro), target.narrow(0, k * micro, micro)};
      at::Tensor loss = m.model->loss(mb);
      if (a.micro_batches > 1) loss = loss / a.micro_batches;
      local_loss += loss.item<double>();
      if (k + 1 < a.micro_batches) {
        DataParallel::NoSync no_sync(dp);
        loss.backward();
      } else {
        loss.backward();
      }
    }
    dp.finish();
    const double lr = schedule.apply(zero ? zero->inner() : *opt);
    if (zero)
      zero->step();
    else
      opt->step();
    schedule.advance();
    if (step == start) {
      first = world.total_stats();
      if (lead && world.size() > 1) {
        std::printf("communicated in step 1 (forward + backward) on rank 0: %llu bytes in %llu calls; ",
                    static_cast<unsigned long long>(first.bytes), static_cast<unsigned long long>(first.calls));
        if (minimum >= 0)
          std::printf("theoretical minimum for plans/%s.yaml: %lld bytes\n", a.model.c_str(),
                      static_cast<long long>(minimum));
        else if (own_plan)
          std::printf("the model states no minimum\n");
        else
          std::printf("no stated minimum for this plan (the model states one for plans/%s.yaml only)\n",
                      a.model.c_str());
      }
    }
    const double value = dp.average(local_loss);
    if (a.check_replicas > 0 && step % a.check_replicas == 0) dp.check_replicas();
    loss_sum += value;
    if (lead && (step % a.log_every == 0 || step == start || step == a.steps)) {
      const auto now = std::chrono::steady_clock::now();
      const double secs = std::chrono::duration<double>(now - since).count();
      const double rate = (step - since_step) * static_cast<double>(items) / std::max(secs, 1e-9);
      // One batch's loss is noisy; the mean since the last line shows the trend.
      std::printf("step %4d  loss %.8f  mean %.4f  %s/s %.0f  lr %.3e\n", step, value, loss_sum / (step - since_step),
                  m.model->items_name().c_str(), rate, lr);
      std::fflush(stdout);
      since = now;
      since_step = step;
      loss_sum = 0;
    }
    if (!a.save.empty() && (step == a.steps || (a.save_every > 0 && step % a.save_every == 0))) save(step);
  }
  // Nothing after the last step may lose the training: a failure says where
  // the model is, or how to keep it next time.
  try {
    test_fail_after_training();
    const CommStats total = world.total_stats();
    in_rank_order(world, [&] {
      const int steps = std::max(1, a.steps - start + 1);
      std::printf("rank %d: communicated %llu bytes in %llu calls over %d steps (%llu per step", world.rank(),
                  static_cast<unsigned long long>(total.bytes), static_cast<unsigned long long>(total.calls), steps,
                  static_cast<unsigned long long>(total.bytes / steps));
      if (minimum >= 0) std::printf("; theoretical minimum %lld", static_cast<long long>(minimum));
      std::printf(")\n");
      if (dp.size() > 1)
        std::printf("rank %d: optimizer state %lld bytes%s\n", world.rank(),
                    static_cast<long long>(zero ? zero->state_bytes() : optimizer_state_bytes(*opt)),
                    zero ? " (ZeRO-1 slices)" : "");
    });
    if (!a.save_weights.empty()) save_pretrained(a, world, *m.module, report, *m.model);
    if (!a.dump_logits.empty()) dump_prompt_logits(a, world, *m.module, plan, report);
    if (a.generate > 0)
      reporting_memory(world, ranks_in_process, "in generation",
                       [&] { generate_text(a, world, *m.module, plan, report); });
  } catch (const std::exception& e) {
    throw Error(std::string("after training: ") + e.what() + " (" + model_whereabouts(a, start) + ")");
  }
}

// --generate and --dump-logits need a language model and a prompt that fits
// its context (usage() otherwise; check_generation throws for --generate).
void check_prompt_options(const Args& a, const ModelHandle& probe, const std::string& program,
                          const std::string& only) {
  if (a.generate == 0 && a.dump_logits.empty()) return;
  auto* lm = dynamic_cast<CausalLM*>(probe.module.get());
  if (!lm)
    usage(program, only,
          std::string(a.generate > 0 ? "--generate" : "--dump-logits") +
              " works with the language models (gpt, llama) only");
  if (a.generate > 0) check_generation(*lm, static_cast<int64_t>(a.prompt.size()), generate_options(a));
  if (a.dump_logits.empty()) return;
  const int64_t n = static_cast<int64_t>(a.prompt.size());
  if (n < 1 || n > lm->context_size())
    usage(program, only,
          "--dump-logits: the prompt has " + std::to_string(n) + " bytes; it needs 1 to the context's " +
              std::to_string(lm->context_size()));
}

}  // namespace

int train_main(int argc, char** argv, const std::string& program, const std::string& default_model, bool fixed_model) {
  Args a = parse_args(argc, argv, program, default_model, fixed_model);
  keep_freed_heap();
  try {
    if (a.ranks > 0 && WorldOptions::env_has_job())
      usage(program, fixed_model ? default_model : "",
            "--ranks runs ranks as threads; do not combine it with a launcher");
    memory_report_requested();  // a bad SHARDPLAN_REPORT_MEMORY fails here, not after training
    std::unique_ptr<Corpus> corpus;
    {
      ModelHandle probe;
      {
        std::lock_guard<std::mutex> lock(init_mutex);
        // Checks the config before any rank starts; its parameters are never
        // read, so they take no memory (a model may not fit twice).
        nn::DeferredInit no_memory;
        probe = make_model(a.model, model_config(a));
      }
      // Before any training, so that a bad prompt fails in a second.
      check_prompt_options(a, probe, program, fixed_model ? default_model : "");
      if (probe.model->needs_corpus())
        corpus = std::make_unique<Corpus>(a.data.empty() ? default_corpus_path() : a.data);
    }
    run_ranks(a.ranks > 0 ? a.ranks : 1, [&](World& w, int in_process) { train(a, w, corpus.get(), in_process); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), e.what());
    return 1;
  }
  return 0;
}

}  // namespace examples
}  // namespace shardplan
