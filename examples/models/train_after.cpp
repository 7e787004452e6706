// Generation and the outputs after the last step (models/train_after.h).
#include "models/train_after.h"

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "models/families/phi3.h"
#include "models/generate.h"
#include "models/hf_config.h"
#include "models/hf_config_gpt2.h"
#include "models/train_checks.h"
#include "models/train_text.h"
#include "models/tokenizer/tokenizer.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/mappings.h"
#include "shardplan/random.h"
#include "shardplan/weights.h"

namespace shardplan {
namespace examples {
namespace {

// `plan` and `mesh` are empty when unsharded.
GenerateOptions generate_options(const Args& a, const Plan& plan = {}, const Mesh& mesh = {}) {
  GenerateOptions o;
  o.new_tokens = a.generate;
  o.temperature = a.temperature;
  o.top_k = a.top_k;
  o.stop_ids = stop_ids(a);
  const std::string axis = plan.sequence_parallel.enabled ? plan.sequence_axis() : "";
  if (!axis.empty()) o.sequence_parts = mesh.axis_size(axis);
  return o;
}

// Rank 0's lines for the samples: each decoded, and where it stopped at EOS.
void print_samples(const Args& a, const GenerateOptions& o, int64_t prompt_tokens, const at::Tensor& tokens) {
  const std::string shown = a.tokenizer ? printable_utf8(a.prompt) : printable(a.prompt);
  std::printf("generate: %d sample(s) of %d tokens after the prompt \"%s\" (%lld tokens), ", a.samples, a.generate,
              shown.c_str(), static_cast<long long>(prompt_tokens));
  if (o.temperature == 0 || o.top_k == 1)
    std::printf("greedy\n");
  else
    std::printf("temperature %g, top-k %d\n", o.temperature, a.top_k);
  for (int i = 0; i < a.samples; ++i) {
    bool stopped = false;
    int64_t length = 0;
    const std::string text = sample_text(a, tokens[i], &stopped, &length);
    std::printf("sample %d: \"%s|%s\"\n", i + 1, shown.c_str(), text.c_str());
    if (stopped)
      std::printf("sample %d stopped at EOS id %lld after %lld tokens\n", i + 1,
                  static_cast<long long>(tokens[i][length].item<int64_t>()), static_cast<long long>(length));
  }
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
  const at::Tensor prompt = prompt_tokens(a).repeat({a.samples, 1});
  const Generation g = generate(*lm, prompt, o, tracker->replicated(), &world.comm());
  const bool lead = world.rank() == 0;
  if (lead) print_samples(a, o, prompt.size(1), g.tokens);
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
  const at::Tensor prompt = prompt_tokens(a);
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

// --save-weights: whole tensors as safetensors, and for llama and gpt2 the
// config.json transformers needs beside them (written by rank 0 after the
// tensors, replaced in one rename).
void save_pretrained(const Args& a, World& world, torch::nn::Module& model, const ParallelReport& report,
                     const ExampleModel& example) {
  SaveWeightsOptions options;
  if (a.model == "gpt2") options.transposed = gpt2_file_layout().save_transposed;  // Conv1D's [in, out]
  // A Phi-3 is saved back as one: its q/k/v and gate/up re-fused.
  if (const LlamaConfig* phi3 = phi3_config_of(model)) options.fused = phi3_save_fused(*phi3);
  save_weights_safetensors(model, report, world, a.save_weights, options);
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

// This rank's communication over the steps trained, and with data
// parallelism its optimizer state.
void print_totals(const TrainRank& r, const DataParallel& dp, const Optimizer& opt, int start, int64_t minimum) {
  const Args& a = r.a;
  const CommStats total = r.world.total_stats();
  in_rank_order(r.world, [&] {
    const int steps = std::max(1, a.steps - start + 1);
    std::printf("rank %d: communicated %llu bytes in %llu calls over %d steps (%llu per step", r.world.rank(),
                static_cast<unsigned long long>(total.bytes), static_cast<unsigned long long>(total.calls), steps,
                static_cast<unsigned long long>(total.bytes / steps));
    if (minimum >= 0) std::printf("; theoretical minimum %lld", static_cast<long long>(minimum));
    std::printf(")\n");
    if (dp.size() > 1)
      std::printf("rank %d: optimizer state %lld bytes%s\n", r.world.rank(), static_cast<long long>(opt.state_bytes()),
                  opt.zero() ? (" (ZeRO-" + std::to_string(dp.zero_stage()) + " slices)").c_str() : "");
  });
}

}  // namespace

void check_generation_fits(const Args& a, torch::nn::Module& module, int ranks_here) {
  auto* lm = dynamic_cast<CausalLM*>(&module);
  if (a.generate == 0 || !lm) return;
  const double esize = module.parameters().empty() ? 4 : module.parameters()[0].element_size();
  const double cache = static_cast<double>(lm->cache_bytes(1).this_rank) * a.samples;
  const double logits = static_cast<double>(prompt_length(a)) * a.samples * lm->vocab_size() * esize;
  check_memory("--samples " + std::to_string(a.samples), "generation (key/value caches and the prompt's logits)",
               cache + logits, ranks_here);
}

void check_prompt_options(const Args& a, const ModelHandle& probe, const std::string& program,
                          const std::string& only) {
  if (a.generate == 0 && a.dump_logits.empty()) return;
  auto* lm = dynamic_cast<CausalLM*>(probe.module.get());
  if (!lm)
    usage(program, only,
          std::string(a.generate > 0 ? "--generate" : "--dump-logits") +
              " works with the language models (gpt, llama) only");
  const int64_t n = prompt_length(a);
  if (a.generate > 0) check_generation(*lm, n, generate_options(a));
  if (a.dump_logits.empty()) return;
  if (n < 1 || n > lm->context_size())
    usage(program, only,
          "--dump-logits: the prompt has " + std::to_string(n) + (a.tokenizer ? " tokens" : " bytes") +
              "; it needs 1 to the context's " +
              std::to_string(lm->context_size()));
}


void after_training(const TrainRank& r, const DataParallel& dp, const Optimizer& opt, int start, int64_t minimum) {
  const Args& a = r.a;
  try {
    test_fail_after_training();
    print_totals(r, dp, opt, start, minimum);
    if (!a.save_weights.empty()) save_pretrained(a, r.world, *r.m.module, r.report, *r.m.model);
    if (!a.dump_logits.empty()) dump_prompt_logits(a, r.world, *r.m.module, r.plan, r.report);
    if (a.generate > 0)
      reporting_memory(r.world, r.ranks_in_process, "in generation",
                       [&] { generate_text(a, r.world, *r.m.module, r.plan, r.report); });
  } catch (const std::exception& e) {
    throw Error(std::string("after training: ") + e.what() + " (" + model_whereabouts(a, start) + ")");
  }
}

}  // namespace examples
}  // namespace shardplan
