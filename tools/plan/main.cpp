// shardplan-plan: `shardplan plan check PLAN.yaml (--model NAME | --state-dict
// FILE | --script FILE [--probe SPEC]) --world N`, the plan checker
// (docs/PLAN_CHECK.md), and `shardplan
// plan auto (--model NAME | --torchscript FILE | --state-dict FILE) --world N
// [--mesh M]`, which prints the plan auto_plan writes for an example model,
// a TorchScript module or a checkpoint's names and shapes (docs/AUTO_PLAN.md)
// and then checks it the same way. The report itself
// comes from the framework (shardplan/plan_check.h, shardplan/dry_run.h); this
// program only builds the example model or reads the checkpoint, and prints.
// Exit status: 0 the plan can run, 1 it cannot (or the inputs cannot be
// read), 2 usage error.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <torch/nn/module.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/corpus.h"
#include "models/model.h"
#include "shardplan/auto_plan.h"
#include "shardplan/count_option.h"
#include "shardplan/dry_run.h"
#include "shardplan/error.h"
#include "shardplan/plan.h"
#include "shardplan/plan_check.h"
#include "pipeline_check.h"
#include "script_check.h"
#include "state_dict.h"
#include "torchscript_plan.h"

namespace {

namespace ex = shardplan::examples;

const char* kUsage =
    "usage: shardplan plan check PLAN.yaml (--model NAME | --state-dict PATH | --script FILE.pt) --world N\n"
    "                            [--format table|json] [--batch B[xT]] [--config KEY=VALUE,...]\n"
    "                            [--dtype float32|float64] [--no-comm]\n"
    "\n"
    "Shows what PLAN.yaml does to a model at N ranks without running it: per parameter the rule,\n"
    "layout, global and local shapes and plugin; every error; parameter bytes per rank; and the\n"
    "bytes one training step (forward + backward) communicates, measured by a dry run on N ranks\n"
    "as threads with a batch of B samples (T tokens each for language models; default 8, and the\n"
    "model's context). Exit status 0: the plan can run; 1: it cannot; 2: usage error.\n"
    "\n"
    "  --model NAME       an example model (--config overrides its settings)\n"
    "  --state-dict PATH  names and shapes from a sharded checkpoint directory or a torch::save\n"
    "                     file; no layer plugin is consulted and nothing is run\n"
    "  --no-comm          skip the dry run\n"
    "  --script FILE.pt   a TorchScript module (torch.jit.script or trace, then save), sharded on N\n"
    "                     thread ranks by shardplan::parallelize_script; with --probe, verified: run\n"
    "                     sharded and unsharded (float64 where it can) and every output compared\n"
    "  --probe SPEC       one forward argument (repeat for more): 2x6 (float64 normal), 2x6:48\n"
    "                     (integers below 48, e.g. token ids) or a file written by torch.save\n"
    "  --plan PLAN.yaml   the plan, instead of the first argument\n"
    "\n"
    "usage: shardplan plan auto (--model NAME | --torchscript FILE.pt | --state-dict PATH) --world N\n"
    "                           [--mesh '{data: 2, model: auto}'] [--save PLAN.yaml] [the options above]\n"
    "\n"
    "Writes a plan with shardplan::auto_plan and prints it with a comment per rule saying why (and\n"
    "what stays replicated), then its report as above. --save also writes it to a file, usable as\n"
    "--plan and by `plan check`.\n"
    "\n"
    "  --model NAME          an example model, probed with one training loss\n"
    "  --torchscript FILE    a module saved by torch.jit.save: its forward graph says which linear and\n"
    "                        convolution ops feed which; checked from its parameters' names and shapes\n"
    "  --state-dict PATH     names and shapes only: an MLP's [h, d] then [d, h] weights of one module\n"
    "                        are paired, every rule saying it was inferred (check it with the model)\n"
    "  --mesh MESH           the plan's mesh, a YAML flow map (default {model: auto}); the model axis\n"
    "                        is planned at its size within N, the other axis splits the batch\n";

struct Args {
  std::string sub, save;
  std::string plan, model, state_dict, torchscript, script, mesh, format = "table", config, dtype = "float32";
  std::vector<std::string> probes;
  int world = 0;
  int64_t batch = 8, tokens = 0;
  bool comm = true;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "shardplan plan: %s\n%s", why.c_str(), kUsage);
  std::string models;
  for (const auto& n : ex::model_names()) models += "  " + n + ": " + ex::model_help(n) + "\n";
  std::fprintf(stderr, "\nmodels:\n%s", models.c_str());
  std::exit(2);
}

bool parse_int(const std::string& s, int64_t& out) {
  const auto v = shardplan::whole_number(s, 1, std::numeric_limits<int64_t>::max());
  if (v) out = *v;
  return v.has_value();
}

Args parse(int argc, char** argv) {
  if (argc < 2) usage("missing subcommand (check)");
  const std::string sub = argv[1];
  if (sub == "--help" || sub == "-h" || sub == "help") {
    std::printf("%s", kUsage);
    std::exit(0);
  }
  if (sub != "check" && sub != "auto") usage("unknown subcommand '" + sub + "' (expected check or auto)");
  Args a;
  a.sub = sub;
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value for " + k);
      return argv[++i];
    };
    if (k == "--help" || k == "-h") {
      std::printf("%s", kUsage);
      std::exit(0);
    } else if (k == "--model") {
      a.model = value();
    } else if (k == "--state-dict") {
      a.state_dict = value();
    } else if (k == "--world") {
      const std::string v = value();
      const auto w = shardplan::whole_number(v, 1, 4096);
      if (!w) usage(shardplan::count_error(k, v, 1, 4096));
      a.world = static_cast<int>(*w);
    } else if (k == "--format") {
      a.format = value();
      if (a.format != "table" && a.format != "json") usage("--format must be table or json");
    } else if (k == "--batch") {
      const std::string v = value();
      const size_t x = v.find('x');
      if (!parse_int(v.substr(0, x), a.batch) || a.batch < 1 ||
          (x != std::string::npos && (!parse_int(v.substr(x + 1), a.tokens) || a.tokens < 1)))
        usage("--batch must be B or BxT with positive integers, got '" + v + "'");
    } else if (k == "--config") {
      a.config += (a.config.empty() ? "" : ",") + value();
    } else if (k == "--dtype") {
      a.dtype = value();
      if (a.dtype != "float32" && a.dtype != "float64") usage("--dtype must be float32 or float64");
    } else if (k == "--script" && a.sub == "check") {
      a.script = value();
    } else if (k == "--probe" && a.sub == "check") {
      a.probes.push_back(value());
    } else if (k == "--plan" && a.sub == "check") {
      if (!a.plan.empty()) usage("the plan is given twice");
      a.plan = value();
    } else if (k == "--no-comm") {
      a.comm = false;
    } else if (k == "--save" && a.sub == "auto") {
      a.save = value();
    } else if (k == "--mesh" && a.sub == "auto") {
      a.mesh = value();
    } else if (k == "--torchscript" && a.sub == "auto") {
      a.torchscript = value();
    } else if (!k.empty() && k[0] == '-') {
      usage("unknown option '" + k + "'");
    } else if (a.plan.empty() && a.sub == "check") {
      a.plan = k;
    } else {
      usage("unexpected argument '" + k + "'");
    }
  }
  if (a.plan.empty() && a.sub == "check") usage("missing PLAN.yaml");
  const int sources = !a.model.empty() + !a.state_dict.empty() + !a.torchscript.empty() + !a.script.empty();
  if (a.sub == "auto" && sources != 1) usage("give exactly one of --model, --torchscript and --state-dict");
  if (sources != 1) usage("give exactly one of --model, --state-dict and --script");
  if (!a.probes.empty() && a.script.empty()) usage("--probe applies to --script only");
  if (a.world == 0) usage("missing --world N");
  if (a.model.empty() && !a.config.empty()) usage("--config applies to --model only");
  if (!a.model.empty()) {
    bool known = false;
    for (const auto& n : ex::model_names()) known |= n == a.model;
    if (!known) usage("unknown model '" + a.model + "'");
  }
  return a;
}

std::string stem(const std::string& path) {
  std::string base = path.substr(path.find_last_of('/') + 1);
  return base.substr(0, base.find('.'));
}

std::string shape_str(const at::Tensor& t) {
  std::string out = "[";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + std::to_string(t.size(d));
  return out + "]";
}

// A value of the model's config ("vocab=256 context=64 ..."), or 0.
int64_t config_value(const ex::ModelHandle& m, const std::string& key) {
  const std::string c = " " + m.model->config_str();
  const size_t at = c.find(" " + key + "=");
  return at == std::string::npos ? 0 : std::stoll(c.substr(at + key.size() + 2));
}

// One batch as training draws it (text windows of examples/data for the
// language models, remapped into a smaller vocabulary when the config has
// one; synthetic images for the ConvNet), cut to T tokens when asked.
ex::Batch make_batch(const ex::ModelHandle& m, const Args& a) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const int64_t vocab = config_value(m, "vocab"), context = config_value(m, "context");
  std::unique_ptr<ex::Corpus> corpus;
  std::error_code ec;
  ex::Batch b;
  if (m.model->needs_corpus() && !std::filesystem::exists(ex::default_corpus_path(), ec)) {
    // An installed tool may not have the source tree's text: any tokens do.
    if (vocab < 1 || context < 1)
      throw shardplan::Error("model '" + a.model + "' needs the corpus " + ex::default_corpus_path() +
                             ", which is missing");
    b = {at::randint(vocab, {a.batch, context}, gen, at::kLong), at::randint(vocab, {a.batch, context}, gen, at::kLong)};
  } else if (m.model->needs_corpus() && vocab > 0 && vocab < ex::Corpus::kVocab) {
    // Byte-level models reject a vocabulary below 256 for the corpus, so
    // sample at 256 and fold the bytes into the model's range.
    corpus = std::make_unique<ex::Corpus>(ex::default_corpus_path());
    auto full = ex::make_model(a.model, [&] {
      auto o = ex::parse_overrides(a.config);
      o["vocab"] = std::to_string(ex::Corpus::kVocab);
      return o;
    }());
    b = full.model->sample(gen, a.batch, corpus.get());
    b.input = b.input.remainder(vocab);
    b.target = b.target.remainder(vocab);
  } else {
    if (m.model->needs_corpus()) corpus = std::make_unique<ex::Corpus>(ex::default_corpus_path());
    b = m.model->sample(gen, a.batch, corpus.get());
  }
  if (a.tokens > 0) {
    b.input = b.input.narrow(1, 0, a.tokens);
    b.target = b.target.narrow(1, 0, a.tokens);
  }
  return b;
}

// auto's plan: saved when asked, printed before its report.
void emit(const shardplan::Plan& plan, const Args& a) {
  const std::string yaml = plan.to_yaml();
  if (!a.save.empty()) {
    std::ofstream out(a.save);
    out << yaml;
    if (!out.flush()) throw shardplan::Error("cannot write " + a.save);
  }
  if (a.format == "table") std::cout << yaml << "\n" << std::flush;
}

// --state-dict and --torchscript: nothing runs, the plan is checked against
// the file's names and shapes (auto writes the plan from the same file).
shardplan::PlanCheck check_file(const Args& a, shardplan::Plan& plan, const shardplan::AutoPlanOptions& options) {
  std::vector<shardplan::TensorShape> params;
  std::vector<std::string> notes;
  std::string subject;
  if (!a.torchscript.empty()) {
    auto file = shardplan_plan::plan_torchscript(a.torchscript, a.world, options);
    plan = file.plan;
    params = file.params;
    subject = "TorchScript file " + a.torchscript;
  } else {
    auto shapes = shardplan_plan::read_state_dict_shapes(a.state_dict);
    if (a.sub == "auto") plan = shardplan_plan::plan_state_dict(shapes, a.state_dict, a.world, options);
    params = shapes.params;
    notes = shapes.notes;
    subject = "state dict " + a.state_dict;
  }
  if (a.sub == "auto") emit(plan, a);
  shardplan::PlanCheck result = shardplan::check_plan_for_shapes(params, plan, a.world);
  result.subject = subject;
  for (const auto& n : notes) result.notes.push_back(n);
  return result;
}

int check(const Args& a) {
  shardplan::Plan plan;
  shardplan::PlanCheck result;
  try {
    shardplan::AutoPlanOptions options;
    options.mesh = a.mesh;
    if (a.sub == "check") plan = shardplan::load_plan(a.plan);
    if (!a.model.empty()) {
      const auto overrides = ex::parse_overrides(a.config);
      const auto dtype = a.dtype == "float64" ? at::kDouble : at::kFloat;
      auto build = [&] {
        at::manual_seed(0);
        auto m = ex::make_model(a.model, overrides);
        m.module->to(dtype);
        return m;
      };
      ex::ModelHandle m = build();
      if (a.tokens > 0) {
        const int64_t context = config_value(m, "context");
        if (context < 1) usage("--batch BxT: model '" + a.model + "' does not take token sequences");
        if (a.tokens > context)
          usage("--batch BxT: T = " + std::to_string(a.tokens) + " exceeds the model's context " +
                std::to_string(context));
      }
      // Drawn once, when first needed: auto's probe and the dry run use the same batch.
      std::optional<ex::Batch> drawn;
      auto batch_of = [&]() -> const ex::Batch& {
        if (!drawn) {
          drawn = make_batch(m, a);
          if (drawn->input.is_floating_point()) drawn->input = drawn->input.to(dtype);
        }
        return *drawn;
      };
      if (a.sub == "auto") {
        // The probe: one training loss on that batch.
        options.probe = [&](torch::nn::Module& model) {
          return ex::as_example(model.shared_from_this()).model->loss(batch_of());
        };
        plan = shardplan::auto_plan(*m.module, a.world, options);
        emit(plan, a);
      }
      result = shardplan::check_plan_for_model(*m.module, plan, a.world);
      result.subject = "model " + a.model + " (" + m.model->config_str() + ", " + a.dtype + ")";
      shardplan_plan::check_pipeline(*m.module, plan, result);
      if (result.ok() && a.comm) {
        const ex::Batch& batch = batch_of();
        std::vector<std::shared_ptr<torch::nn::Module>> replicas;
        for (int r = 0; r < a.world; ++r) replicas.push_back(build().module);
        // Some problems only show in a forward (a loss layout of the wrong
        // rank): they are the plan's errors like the others.
        try {
          std::string dp;
          result.step_comm = shardplan::measure_step_comm(
              plan, replicas,
              [&](torch::nn::Module& replica) {
                replica.train();
                return ex::as_example(replica.shared_from_this()).model->loss(batch);
              },
              &dp);
          // The batch axis' bucket plan and traffic, one note per line.
          for (size_t at = 0; at < dp.size();) {
            const size_t end = dp.find('\n', at);
            result.notes.push_back(dp.substr(at, end - at));
            at = end == std::string::npos ? dp.size() : end + 1;
          }
        } catch (const std::exception& e) {
          result.errors.push_back(std::string("dry run of one training step: ") + e.what());
        }
        result.batch = shape_str(batch.input);
        const int64_t esize = a.dtype == "float64" ? 8 : 4;
        const int64_t minimum =
            stem(a.plan) == a.model && a.tokens == 0 ? m.model->min_comm_bytes(a.batch, a.world, esize) : -1;
        if (minimum >= 0)
          result.notes.push_back("the model states a theoretical minimum of " + std::to_string(minimum) +
                                 " bytes per rank and step for plans/" + a.model + ".yaml at this batch");
      } else if (result.ok()) {
        result.notes.push_back("communication not measured (--no-comm)");
      }
    } else if (!a.script.empty()) {
      result = shardplan_plan::check_script(a.script, plan, a.world, a.probes);
    } else {
      result = check_file(a, plan, options);
    }
  } catch (const std::exception& e) {
    // The plan or the inputs could not be read at all: no report.
    result.plan_file = a.sub == "auto" ? "(auto_plan)" : a.plan;
    result.world_size = a.world;
    result.subject = !a.model.empty()         ? "model " + a.model
                     : !a.torchscript.empty() ? "TorchScript file " + a.torchscript
                     : !a.script.empty()      ? "TorchScript module " + a.script
                                              : "state dict " + a.state_dict;
    result.errors.push_back(e.what());
  }
  std::cout << (a.format == "json" ? result.json() : result.table()) << std::flush;
  return result.ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  return check(a);
}
