#include "models/train_args.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>

#include "models/checkpoint_history.h"
#include "models/hf_config.h"
#include "models/model.h"
#include "models/options.h"
#include "models/schedule.h"
#include "models/train_checks.h"
#include "shardplan/error.h"
#include "shardplan/weights.h"

namespace shardplan {
namespace examples {
namespace {

// Defaults that make each model learn visibly in a minute or two on 2 cores.
struct Defaults {
  const char* model;
  int steps, batch, log_every;
  double lr;
};
const Defaults kDefaults[] = {
    {"gpt", 300, 16, 20, 2e-3},
    {"convnet", 100, 32, 10, 1e-3},
    {"lstm_lm", 200, 16, 20, 3e-3},
    {"llama", 300, 16, 20, 2e-3},
    {"gpt2", 300, 16, 20, 2e-3},
};

}  // namespace

[[noreturn]] void usage(const std::string& program, const std::string& only, const std::string& why) {
  const bool fixed = !only.empty();
  std::string models;
  for (const auto& n : model_names())
    if (!fixed || n == only) models += "\n  " + n + ": " + model_help(n);
  std::fprintf(stderr,
               "%s: %s\nusage: %s %s[--config KEY=VALUE,...] [--plan PLAN.yaml|auto] [--ranks N] [--steps N]\n"
               "       [--batch N] [--lr X] [--warmup N] [--lr-min X] [--override-schedule]\n"
               "       [--optimizer adam|adamw|sgd|rmsprop|adagrad] [--dtype float32|float64|bfloat16|float16\n"
               "       [--master float32|bfloat16|float16] [--loss-scale dynamic]]\n"
               "       [--seed N] [--threads N] [--log-every N] [--data TEXT_FILE] [--report]\n"
               "       [--save DIR [--save-every N] [--keep K] [--resume auto]] [--load DIR] [--micro-batches N]\n"
               "       [--check-replicas N] [--clip X [--clip-with shardplan|torch]] [--load-weights PATH [--rename-weights REGEX=REPLACEMENT]...\n"
               "       [--lenient-weights]] [--save-weights PATH] [--dump-logits FILE.safetensors [--prompt TEXT]]\n"
               "       [--generate N [--prompt TEXT] [--temperature X] [--top-k K] [--samples S]] [--tokenizer DIR]\n"
               "--save writes a sharded checkpoint (model, optimizer, step) to DIR after the last step, and\n"
               "every N steps with --save-every, keeping the newest K (--keep, default 2: DIR and DIR.step-N);\n"
               "--load resumes from one, saved at any number of ranks,\n"
               "training on from its step to --steps (docs/CHECKPOINTS.md); --threads sets libtorch's and\n"
               "the BLAS pool's threads per rank (default: SHARDPLAN_NUM_THREADS, else cores / ranks on\n"
               "this machine; docs/THREADS.md); --resume auto loads the newest checkpoint of --save that loads\n"
               "(a run restarted by shardplan launch --max-restarts goes on from its last save)\n"
               "--load-weights reads weights trained elsewhere, each rank only its shard (a safetensors file or\n"
               "directory, or a torch.save state dict; llama, gpt2: the shape from config.json beside them, which\n"
               "--config overrides; names in the file renamed to the model's by each --rename-weights in\n"
               "order; every missing or unexpected name is an error, a warning with --lenient-weights);\n"
               "--save-weights writes the whole tensors as safetensors (+ config.json)\n"
               "after the last step (docs/WEIGHTS.md); --steps 0 with --load-weights only generates\n"
               "--dump-logits FILE (gpt, llama): after training (and --save-weights), rank 0 writes the logits of\n"
               "one forward over --prompt as safetensors: one tensor \"logits\" [prompt bytes, vocab], the whole\n"
               "vocabulary, in --dtype (read it with Python's safetensors, or tests/weights/interop.py)\n"
               "--plan auto plans the model by itself (shardplan::auto_plan, docs/AUTO_PLAN.md; --report shows it)\n"
               "--batch is the global batch: a plan with a batch axis (mesh {data: 2, model: 2}) gives each\n"
               "data rank its slice; --micro-batches accumulates gradients over N slices of it per step;\n"
               "--check-replicas N compares every replicated parameter across its groups every N steps (default 10;\n"
               "0: never); --clip X scales the gradients to a total norm of at most X before each step (the norm\n"
               "of the unsharded model's gradient, shardplan::clip_grad_norm_) and prints the norm; --clip-with torch\n"
               "uses torch::nn::utils::clip_grad_norm_ on this rank's own parameters instead (one process only:\n"
               "on shards the replicas drift, and the replica check stops the run)\n"
               "--generate N (gpt, llama): after training, S samples (default 3) of N new bytes each after --prompt\n"
               "(default \"From fairest creatures\"), temperature X (default 0.8; 0: greedy) over the top K\n"
               "(default 20; 0: all), with a key/value cache split by heads; prompt + N must fit the context,\n"
               "and the S samples' caches this machine's memory (both checked before training)\n"
               "--tokenizer DIR (default: the --load-weights directory when it holds one): its tokenizer.json or\n"
               "tokenizer.model encodes --prompt (BOS as its tokenizer_config.json says), decodes the samples,\n"
               "and generation stops at its EOS (generation_config.json's eos_token_id); without one a byte is a token\n"
               "--optimizer: adam (default), adamw, sgd (momentum 0.9), rmsprop, adagrad (torch's defaults)\n"
               "--dtype bfloat16 or float16: parameters and activations in it, the optimizer stepping float32\n"
               "master weights (--master float32, the default; --master bfloat16 with --dtype bfloat16: pure\n"
               "bfloat16), gradients accumulated in the masters' dtype; float16 needs --loss-scale dynamic\n"
               "(docs/TRAINING_NUMERICS.md); checkpoints keep the float32 masters\n"
               "--warmup N raises the lr linearly over the first N steps (--lr / N at step 1), --lr-min X decays it\n"
               "from --lr to X by a cosine over the steps after (Megatron's); a resume continues the schedule of\n"
               "its checkpoint and refuses others unless --override-schedule (README, \"Learning-rate schedules\")\n"
               "%s%s\n",
               program.c_str(), why.c_str(), program.c_str(), fixed ? "" : "[--model NAME] ",
               fixed ? "model:" : "models:", models.c_str());
  std::exit(2);
}

namespace {

// --dtype, --master and --loss-scale together.
void check_precision(Args& a, const std::string& program, const std::string& only) {
  const bool half = a.dtype == "bfloat16" || a.dtype == "float16";
  if (a.dtype != "float32" && a.dtype != "float64" && !half)
    usage(program, only, "--dtype must be float32, float64, bfloat16 or float16, got '" + a.dtype + "'");
  if (!half && (!a.master.empty() || a.loss_scale))
    usage(program, only,
          std::string(a.master.empty() ? "--loss-scale" : "--master") +
              " takes effect with --dtype bfloat16 or float16 only");
  if (!half) return;
  if (a.master.empty()) a.master = "float32";
  if (a.master != "float32" && a.master != a.dtype)
    usage(program, only, "--master must be float32 or --dtype's own " + a.dtype + ", got '" + a.master + "'");
  if (a.dtype == "float16" && !a.loss_scale)
    usage(program, only,
          "--dtype float16 needs --loss-scale dynamic: its small gradients underflow to zero without loss "
          "scaling (or train in bfloat16)");
}

// The model's defaults into `a`, where options left them unset.
void apply_defaults(Args& a, const std::string& program, const std::string& only) {
  const Defaults* d = nullptr;
  for (const auto& x : kDefaults)
    if (a.model == x.model) d = &x;
  if (!d) usage(program, only, "unknown model '" + a.model + "'");
  if (a.steps < 0) a.steps = d->steps;
  if (a.batch < 0) a.batch = d->batch;
  if (a.log_every < 0) a.log_every = d->log_every;
  if (std::isnan(a.lr)) a.lr = d->lr;
}

// Options that take effect only with another; the first missing one, or "".
std::string needs_of_options(const Args& a) {
  if (a.save_every < 0 || (a.save_every > 0 && a.save.empty()))
    return "--save-every needs --save DIR and a positive step count";
  if (a.keep_given && a.save.empty()) return "--keep takes effect with --save DIR only";
  if (a.clip_with_given && a.clip == 0) return "--clip-with takes effect with --clip X only";
  if (a.generate == 0 && !a.generation_option.empty())
    return a.generation_option + " takes effect with --generate N only";
  if (a.generate == 0 && a.dump_logits.empty() && a.prompt_given)
    return "--prompt takes effect with --generate N or --dump-logits FILE only";
  if (a.generate == 0 && a.dump_logits.empty() && !a.tokenizer_dir.empty())
    return "--tokenizer takes effect with --generate N or --dump-logits FILE only";
  if (a.resume_auto && (a.save.empty() || !a.load.empty())) return "--resume auto needs --save DIR and no --load";
  return "";
}

// Where the model's weights come from: a restart's checkpoint, --load or
// --load-weights, never two of them.
void check_weights_source(Args& a, const std::string& program, const std::string& only) {
  // A restart goes on from its checkpoint, not from the weights it started
  // with; which one (a damaged newest one is skipped) the ranks decide
  // together in train_loop.cpp.
  if (a.resume_auto && !resume_candidates(a.save).empty()) {
    a.load = a.save;
    a.load_weights.clear();
    a.rename_weights.clear();
    a.lenient_weights = false;
  }
  // --steps 0: the loaded weights as they are (e.g. to --generate from them).
  if (a.steps == 0 && a.load_weights.empty() && a.load.empty())
    usage(program, only, "--steps 0 trains nothing: it needs --load-weights PATH or --load DIR");
  if (!a.load.empty() && !a.load_weights.empty())
    usage(program, only, "--load and --load-weights both set the model: give one");
  if (a.load_weights.empty() && (!a.rename_weights.empty() || a.lenient_weights))
    usage(program, only, "--rename-weights and --lenient-weights take effect with --load-weights only");
  try {
    shardplan::check_rename_rules(a.rename_weights);
  } catch (const std::exception& e) {
    usage(program, only, std::string("--rename-weights: ") + e.what());
  }
}

// The option values that need each other or the model's defaults; every
// check a run could otherwise fail later in is made here or before step 1.
void check_args(Args& a, const std::string& program, const std::string& only) {
  if (a.optimizer != "adam" && a.optimizer != "adamw" && a.optimizer != "sgd" && a.optimizer != "rmsprop" &&
      a.optimizer != "adagrad")
    usage(program, only, "--optimizer must be adam, adamw, sgd, rmsprop or adagrad, got '" + a.optimizer + "'");
  check_precision(a, program, only);
  apply_defaults(a, program, only);
  if (!(a.lr > 0)) usage(program, only, "--lr must be a positive number");
  if (a.micro_batches < 1 || a.check_replicas < 0)
    usage(program, only, "--micro-batches must be at least 1, --check-replicas not negative");
  if (a.generate < 0 || a.samples < 1)
    usage(program, only, "--generate must not be negative, --samples at least 1");
  const std::string needs = needs_of_options(a);
  if (!needs.empty()) usage(program, only, needs);
  // One file, not a directory of shards: what Python reads back whole.
  const std::string ext = ".safetensors";
  if (!a.dump_logits.empty() &&
      (a.dump_logits.size() <= ext.size() || a.dump_logits.compare(a.dump_logits.size() - ext.size(), ext.size(), ext)))
    usage(program, only, "--dump-logits takes a file name ending in .safetensors, got '" + a.dump_logits + "'");
  if (a.steps < 0 || a.batch < 1 || a.log_every < 1 || a.ranks < 0 || a.threads < 0)
    usage(program, only, "--batch and --log-every must be at least 1, --steps, --ranks and --threads not negative");
  check_weights_source(a, program, only);
  // As SHARDPLAN_NUM_THREADS: a larger count is a typo, not a machine.
  if (a.ranks > 4096 || a.threads > 4096) usage(program, only, "--ranks and --threads must be at most 4096");
  const std::string schedule = check_schedule_options(a);
  if (!schedule.empty()) usage(program, only, schedule);
  try {
    if (!a.save.empty()) check_save_dir(a.save, "--save");
    if (!a.save_weights.empty()) check_save_dir(a.save_weights, "--save-weights");
    if (!a.dump_logits.empty()) check_save_dir(a.dump_logits, "--dump-logits");
  } catch (const std::exception& e) {
    usage(program, only, e.what());
  }
}

// The options of what a step does (the optimizer and its lr schedule, the
// precision, micro-batches, clipping, the replica check) into `a`; false
// when `k` is none of them. A bad value throws CountError with its line.
bool parse_step_option(Args& a, const std::string& k, const std::function<std::string()>& value) {
  if (k == "--lr") a.lr = option_double(value());
  else if (k == "--warmup") a.warmup = count_option_int(k, value(), 0);
  else if (k == "--lr-min") a.lr_min = option_double(value());
  else if (k == "--override-schedule") a.override_schedule = true;
  else if (k == "--optimizer") a.optimizer = value();
  else if (k == "--dtype") a.dtype = value();
  else if (k == "--master") a.master = value();
  else if (k == "--loss-scale") {
    const std::string how = value();
    if (how != "dynamic") throw CountError("--loss-scale takes 'dynamic' only, got '" + how + "'");
    a.loss_scale = true;
  } else if (k == "--micro-batches") a.micro_batches = count_option_int(k, value(), 1);
  else if (k == "--check-replicas") a.check_replicas = count_option_int(k, value(), 0);
  else if (k == "--clip") a.clip = clip_option(value());
  else if (k == "--clip-with") {
    const std::string with = value();
    if (with != "shardplan" && with != "torch")
      throw CountError("--clip-with takes shardplan or torch, got '" + with + "'");
    a.clip_with_torch = with == "torch";
    a.clip_with_given = true;
  } else return false;
  return true;
}

// The options of the run itself (model, data, sizes, ranks) into `a`;
// false when `k` is none of them.
bool parse_run_option(Args& a, const std::string& k, const std::function<std::string()>& value) {
  if (k == "--config") a.config += (a.config.empty() ? "" : ",") + value();
  else if (k == "--plan") a.plan = value();
  else if (k == "--data") a.data = value();
  else if (k == "--ranks") a.ranks = count_option_int(k, value(), 0, 4096);
  else if (k == "--steps") a.steps = count_option_int(k, value(), 0);
  else if (k == "--batch") a.batch = count_option_int(k, value(), 1);
  else if (k == "--log-every") a.log_every = count_option_int(k, value(), 1);
  else if (k == "--seed") a.seed = option_seed(value());
  else if (k == "--threads") a.threads = count_option_int(k, value(), 0, 4096);
  else if (k == "--report") a.report = true;
  else return false;
  return true;
}

// Checkpoints and weights files, in and out.
bool parse_checkpoint_option(Args& a, const std::string& k, const std::function<std::string()>& value) {
  if (k == "--save") a.save = value();
  else if (k == "--save-every") a.save_every = count_option_int(k, value(), 0);
  else if (k == "--keep") {
    a.keep_given = true;
    a.keep = count_option_int(k, value(), 1);
  } else if (k == "--load") a.load = value();
  else if (k == "--resume") {
    if (value() != "auto") throw CountError("--resume takes 'auto' only");
    a.resume_auto = true;
  } else if (k == "--load-weights") a.load_weights = value();
  else if (k == "--save-weights") a.save_weights = value();
  else if (k == "--rename-weights") {
    const std::string rule = value();
    const auto eq = rule.find('=');
    if (eq == std::string::npos || eq == 0)
      throw CountError("--rename-weights takes REGEX=REPLACEMENT, got '" + rule + "'");
    a.rename_weights.emplace_back(rule.substr(0, eq), rule.substr(eq + 1));
  } else if (k == "--lenient-weights") a.lenient_weights = true;
  else return false;
  return true;
}

// What the trained model produces: logits dumped, text generated.
bool parse_output_option(Args& a, const std::string& k, const std::function<std::string()>& value) {
  if (k == "--temperature" || k == "--top-k" || k == "--samples") a.generation_option = k;
  if (k == "--dump-logits") a.dump_logits = value();
  else if (k == "--generate") a.generate = count_option_int(k, value(), 0);
  else if (k == "--prompt") {
    a.prompt = value();
    a.prompt_given = true;
  } else if (k == "--tokenizer") a.tokenizer_dir = value();
  else if (k == "--temperature") a.temperature = option_double(value());
  else if (k == "--top-k") a.top_k = count_option_int(k, value(), 0);
  else if (k == "--samples") a.samples = count_option_int(k, value(), 1);
  else return false;
  return true;
}

}  // namespace

Args parse_args(int argc, char** argv, const std::string& program, const std::string& default_model, bool fixed) {
  const std::string only = fixed ? default_model : "";
  Args a;
  a.model = default_model;
  bool model_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i], v;
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(program, only, "missing value for " + k);
      return v = argv[++i];
    };
    try {
      if (parse_step_option(a, k, value) || parse_run_option(a, k, value) || parse_checkpoint_option(a, k, value) ||
          parse_output_option(a, k, value))
        continue;
      if (k == "--model" && !fixed) {
        a.model = value();
        model_given = true;
      } else if (k == "--help" || k == "-h")
        usage(program, only, "tensor-parallel training of an example model");
      else
        usage(program, only, "unknown argument '" + k + "'");
    } catch (const CountError& e) {
      usage(program, only, e.what());
    } catch (const std::logic_error&) {
      usage(program, only, "bad value for " + k + ": '" + v + "'");
    }
  }
  // config.json's model_type picks the model (a qwen2 directory trains the llama example).
  try {
    if (!fixed) a.model = hf_model_for_weights(a.load_weights, a.model, model_given);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), e.what());
    std::exit(1);
  }
  check_args(a, program, only);
  return a;
}

}  // namespace examples
}  // namespace shardplan
