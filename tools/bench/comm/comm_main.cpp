// `shardplan bench comm`: the coordinator. It never loads a backend into its
// own process to measure it: every series runs in worker processes of this
// same executable (comm --worker ...), so a crashing or hanging backend ends
// as an error line for that series while the others still run.
#include "comm_main.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "options.h"
#include "plot.h"
#include "progress.h"
#include "protocol.h"
#include "report.h"
#include "results.h"
#include "series.h"
#include "spawn.h"
#include "plugin.h"
#include "worker.h"

namespace shardplan_bench {

namespace {

const char* const kTool = "shardplan bench comm";

// Extra silence allowed past the backends' own timeout, which should fire
// first and name the operation.
constexpr auto kSilenceGrace = std::chrono::seconds(30);

std::vector<Process> processes_for(const Options& o, const Series& s, const std::string& dir) {
  WorkerOptions w;
  w.series = s.name;
  w.kind = s.kind;
  w.launch = s.launch;
  w.plugin = s.plugin;
  w.plugin_options = s.options;
  w.cuda = s.cuda;
  w.dir = dir;
  const std::string self = self_exe();
  auto command = [&](const WorkerOptions& wo) {
    std::vector<std::string> argv{self, "comm"};
    for (std::string& a : worker_args(o, wo)) argv.push_back(std::move(a));
    return argv;
  };
  std::vector<Process> procs;
  if (s.launch == "threads") {
    procs.push_back({"the worker process", command(w)});
  } else if (s.launch == "procs") {
    for (int r = 0; r < o.ranks; ++r) {
      WorkerOptions wr = w;
      wr.rank = r;
      procs.push_back({"rank " + std::to_string(r), command(wr)});
    }
  } else {
    // Ranks unbound, like every other series' ranks; as many as asked for,
    // whatever the core count.
    std::vector<std::string> argv{find_program(o.mpirun), "-np", std::to_string(o.ranks), "--oversubscribe",
                                  "--bind-to", "none"};
    if (::geteuid() == 0) argv.push_back("--allow-run-as-root");
    for (std::string& a : command(w)) argv.push_back(std::move(a));
    procs.push_back({"mpirun", argv});
  }
  return procs;
}

SeriesResult run_series(const Options& o, const Series& s, const std::string& dir, Progress& progress) {
  SeriesResult result;
  result.series = s;
  ::mkdir(dir.c_str(), 0700);
  Collector collector(o.ranks);
  std::string first_error;  // what a worker said before giving up
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> env;
  if (::geteuid() == 0) env = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"};
  SpawnResult sr = run_processes(
      processes_for(o, s, dir), env, std::chrono::milliseconds(o.sweep.timeout_ms) + kSilenceGrace,
      [&](const std::string& line) {
        Message m = decode(line);
        switch (m.kind) {
          case Message::At: progress.at(m.coll, m.bytes); break;
          case Message::Row:
            collector.add(m.row);
            progress.row(m.row);
            break;
          case Message::Note:
            if (std::find(result.notes.begin(), result.notes.end(), m.text) == result.notes.end())
              result.notes.push_back(m.text);
            break;
          case Message::Done: collector.done(m.rank); break;
          case Message::Error: {
            const std::string who = m.rank >= 0 ? "rank " + std::to_string(m.rank) : "worker";
            progress.message(s.name + " " + who + ": " + m.text);
            if (first_error.empty()) first_error = who + ": " + m.text;
            break;
          }
          case Message::None: break;
        }
      });
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.rows = collector.rows();
  result.ok = sr.ok && collector.all_done();
  if (!sr.ok) result.error = sr.error;
  else if (!result.ok) result.error = "not every rank reported the end of its sweep";
  if (!result.ok && !first_error.empty()) result.error += "; " + first_error;
  return result;
}

}  // namespace

int comm_main(int argc, char** argv) {
  Options o;
  try {
    o = parse_options(argc, argv);
  } catch (const UsageError& e) {
    if (e.message.empty()) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "%s: %s (try --help)\n", kTool, e.message.c_str());
    return 2;
  }
  if (o.worker) return worker_main(o);

  SeriesPlan plan;
  try {
    plan = plan_series(o);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n", kTool, e.message.c_str());
    return 2;
  }
  if (o.list) {
    for (const Series& s : plan.series)
      std::printf("%-10s %-9s %s\n", s.name.c_str(), s.reference() ? "reference" : "plugin",
                  s.describe(o.ranks).c_str());
    for (const Unavailable& u : plan.unavailable) std::printf("%-10s %-9s not available: %s\n", u.name.c_str(), "", u.reason.c_str());
    return 0;
  }
  if (plan.series.empty()) {
    std::fprintf(stderr, "%s: nothing to run (no backend found that can run here)\n", kTool);
    return 1;
  }
  if (!o.plot.empty() && find_program("gnuplot").empty()) {
    std::fprintf(stderr, "%s: %s\n", kTool, gnuplot_missing_message().c_str());
    return 2;
  }
  for (const Unavailable& u : plan.unavailable)
    std::fprintf(stderr, "%s: skipping %s: %s\n", kTool, u.name.c_str(), u.reason.c_str());

  const char* tmp_env = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp_env && *tmp_env ? tmp_env : "/tmp") + "/shardplan-bench.XXXXXX";
  if (!::mkdtemp(tmpl.data())) {
    std::fprintf(stderr, "%s: cannot create a temporary directory from %s\n", kTool, tmpl.c_str());
    return 1;
  }
  const std::string dir = tmpl;

  install_interrupt_handler();
  const auto t0 = std::chrono::steady_clock::now();
  Progress progress(o, plan.series);
  std::vector<SeriesResult> results;
  for (size_t i = 0; i < plan.series.size() && !interrupted(); ++i) {
    progress.start_series(i);
    results.push_back(run_series(o, plan.series[i], dir + "/" + std::to_string(i) + "-" + plan.series[i].name, progress));
    progress.end_series(results.back());
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  progress.finish();

  const RunInfo info =
      describe_run(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  print_tables(stdout, o, info, results, plan.unavailable);
  std::fflush(stdout);

  int rc = 0;
  for (const SeriesResult& r : results)
    if (!r.ok) {
      std::fprintf(stderr, "%s: %s failed: %s\n", kTool, r.series.name.c_str(), r.error.c_str());
      rc = 1;
    }
  int64_t wrong = 0;
  for (const SeriesResult& r : results)
    for (const Row& row : r.rows)
      for (const ModeResult* m : {&row.out, &row.in})
        if (m->measured && m->wrong > 0) wrong += m->wrong;
  if (wrong > 0) {
    std::fprintf(stderr, "%s: --check found %lld wrong elements\n", kTool, static_cast<long long>(wrong));
    rc = 1;
  }
  try {
    if (!o.csv.empty()) write_csv(o.csv, o, results);
    if (!o.json.empty()) write_json(o.json, o, info, results, plan.unavailable);
    if (!o.plot.empty()) plot_png(o.plot, o, results);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kTool, e.what());
    rc = 1;
  }
  if (interrupted()) rc = 130;
  return rc;
}

}  // namespace shardplan_bench
