#pragma once
// The command line of the training driver (train_loop.cpp): every option,
// parsed whole and checked against the others before anything runs.
// Torch-free.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace shardplan {
namespace examples {

class Tokenizer;

struct Args {
  std::string model;
  std::string config;  // key=value,...
  std::string plan;
  std::string data;
  int ranks = 0;  // 0: from the launcher's environment, else 1
  int steps = -1, batch = -1, log_every = -1;
  double lr = std::nan("");  // unset: the model's default (options never parse to nan)
  // The lr schedule (models/schedule.h): warmup steps, the cosine decay's
  // end (nan: no decay), and whether a resume may change them.
  int warmup = 0;
  double lr_min = std::nan("");
  bool override_schedule = false;
  std::string optimizer = "adam";
  std::string dtype = "float32";
  // --dtype bfloat16|float16: parameters and activations in it, the
  // optimizer stepping master weights in --master (float32 unless it is
  // --dtype itself: pure half precision; shardplan/mixed_precision.h), and
  // float16 needing --loss-scale dynamic. Empty for float32 and float64.
  std::string master;
  bool loss_scale = false;  // --loss-scale dynamic: torch's GradScaler rule
  uint64_t seed = 0;
  int threads = 0;  // 0: SHARDPLAN_NUM_THREADS, else the cores shared out among this machine's ranks
  bool report = false;
  std::string save, load;  // checkpoint directories
  // --resume auto: --load the checkpoint in --save when there is one (a run
  // restarted by `shardplan launch --max-restarts` goes on from its last save).
  bool resume_auto = false;
  // Weights from and to PyTorch (shardplan/weights.h): safetensors (a file,
  // or a directory, with config.json for llama) or a torch.save state dict.
  std::string load_weights, save_weights;
  // Names in the file -> the model's: "REGEX=REPLACEMENT", applied in order.
  std::vector<std::pair<std::string, std::string>> rename_weights;
  bool lenient_weights = false;  // missing and unexpected names are warnings
  int save_every = 0;      // 0: save once, after the last step
  // Checkpoints --save keeps: DIR the newest, DIR.step-N the ones before it
  // (models/checkpoint_history.h), for --resume auto to fall back on.
  int keep = 2;
  bool keep_given = false;
  int micro_batches = 1;   // gradient accumulation: micro-batches per step
  // The replica check every N steps (0: never): on by default, since a
  // drift (torch's clip_grad_norm_ on shards, a rank-local random stream)
  // is otherwise silent; its cost at N = 50 is in docs/BENCHMARKS.md.
  int check_replicas = 10;
  // --clip X: gradients scaled to a total norm of at most X (0: no clipping)
  // by shardplan::clip_grad_norm_, every element of the unsharded model
  // counted once; --clip-with torch: by torch::nn::utils::clip_grad_norm_
  // over this rank's own parameters instead (right for one unsharded
  // process, the reference; on shards the replicas drift).
  double clip = 0;
  bool clip_with_torch = false;
  bool clip_with_given = false;
  // After training, rank 0 writes the logits of one forward over --prompt,
  // the vocabulary whole, as a safetensors file (gpt, llama): how
  // tests/e2e/llama_logits.sh compares them with PyTorch's.
  std::string dump_logits;
  // Text generation after training (gpt only).
  int generate = 0;  // new tokens per sample (0: none)
  std::string prompt = "From fairest creatures";  // the sonnets' first line, begun
  double temperature = 0.8;
  int top_k = 20;
  int samples = 3;
  std::string generation_option;  // the last of --temperature, --top-k, --samples given (they need --generate)
  bool prompt_given = false;      // --prompt needs --generate or --dump-logits
  // --tokenizer DIR: a checkpoint directory's tokenizer.json or
  // tokenizer.model (models/tokenizer/tokenizer.h) for --prompt and the
  // samples; without it the --load-weights directory's, when it holds one;
  // else bytes are tokens. Loaded by train_main (models/train_text.h)
  // before any rank starts, and shared by the thread ranks (it is read only).
  std::string tokenizer_dir;
  std::shared_ptr<const Tokenizer> tokenizer;
};

// Bytes per element of a --dtype name (float64 8, float32 4, the halves 2).
inline int dtype_bytes(const std::string& dtype) {
  return dtype == "float64" ? 8 : dtype == "float32" ? 4 : 2;
}

// Prints why and the usage to stderr and exits with status 2. `only`: the one
// model a fixed program trains ("" lists every model).
[[noreturn]] void usage(const std::string& program, const std::string& only, const std::string& why);

// The options, with the model's defaults filled in; a bad one ends in usage().
Args parse_args(int argc, char** argv, const std::string& program, const std::string& default_model, bool fixed);

}  // namespace examples
}  // namespace shardplan
