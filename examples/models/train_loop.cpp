#include "models/train_loop.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "models/corpus.h"
#include "models/heap.h"
#include "models/model.h"
#include "models/out_of_memory.h"
#include "models/ranks.h"
#include "models/schedule.h"
#include "models/train_after.h"
#include "models/train_args.h"
#include "models/train_pipeline.h"
#include "models/train_rank.h"
#include "models/train_step.h"
#include "models/train_text.h"
#include "shardplan/data_parallel.h"
#include "shardplan/error.h"
#include "shardplan/mixed_precision.h"
#include "shardplan/nn/deferred_init.h"
#include "shardplan/optimizer.h"
#include "shardplan/world.h"

namespace shardplan {
namespace examples {
namespace {

void train(const Args& a, World& world, const Corpus* corpus, int ranks_in_process) {
  // The world already chose the default; intra-op threads are a per-thread
  // setting, so each rank sets its own.
  const ThreadSettings threads =
      a.threads > 0 ? set_num_threads(a.threads, world.options().local_world_size, ranks_in_process) : world.threads();
  TrainRank r{a, world, corpus, ranks_in_process, dtype_from_name(a.dtype, "--dtype")};
  build_sharded_model(r, threads.str());
  if (r.plan.pipeline.enabled) return train_pipelined(r);
  // Gradients averaged over the plan's batch axis, if it has one.
  DataParallel dp = naming_out_of_memory("the data-parallel gradient buckets",
                                         [&] { return DataParallel(*r.m.module, r.report, r.plan, world); });
  load_into_slices(r, dp);
  check_data_parallel(r, dp);
  check_generation_fits(a, *r.m.module, std::max(ranks_in_process, world.options().local_world_size));
  print_parameter_bytes(r, dp.size());
  const std::unique_ptr<Optimizer> opt =
      naming_out_of_memory("the optimizer's slices", [&] { return make_optimizer(a, dp); });
  Schedule schedule(schedule_settings(a));

  // The same data stream on every rank.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(a.seed + 1);
  TrainCheckpoints checkpoints(r, *opt, schedule);
  const int start = checkpoints.resume(gen);

  r.m.module->train();
  world.reset_stats();
  StepLog log(r, start, &dp);
  for (int step = start; step <= a.steps; ++step) {
    world.trace_step(step);  // SHARDPLAN_COMM_TRACE's step marker; nothing when off
    // Every rank draws the global batch and trains on its data rank's slice.
    const StepResult s = train_step(r, dp, *opt, schedule, r.m.model->sample(gen, a.batch, corpus), step);
    if (a.check_replicas > 0 && step % a.check_replicas == 0) check_replicas_at(step, dp);
    log.after_step(step, s);
    checkpoints.maybe_save(step);
  }
  after_training(r, dp, *opt, start, log.minimum());
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
        std::lock_guard<std::mutex> lock(model_init_mutex());
        // Checks the config before any rank starts; its parameters are never
        // read, so they take no memory (a model may not fit twice).
        nn::DeferredInit no_memory;
        probe = make_model(a.model, model_config(a));
      }
      // Before any training, so that a bad prompt fails in a second.
      if (auto* lm = dynamic_cast<CausalLM*>(probe.module.get())) load_prompt_tokenizer(a, lm->vocab_size());
      check_prompt_options(a, probe, program, fixed_model ? default_model : "");
      if (probe.model->needs_corpus())
        corpus = std::make_unique<Corpus>(a.data.empty() ? default_corpus_path() : a.data);
    }
    run_ranks(a.ranks > 0 ? a.ranks : 1, [&](World& w, int in_process) { train(a, w, corpus.get(), in_process); });
  } catch (const std::exception& e) {
    std::fflush(stdout);  // the error on a line of its own after what the ranks printed
    // A libtorch error (a kernel this build lacks, as float16 LayerNorm on
    // CPU) without its backtrace: one line.
    const auto* c10e = dynamic_cast<const c10::Error*>(&e);
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), c10e ? c10e->what_without_backtrace() : e.what());
    return 1;
  }
  return 0;
}

}  // namespace examples
}  // namespace shardplan
