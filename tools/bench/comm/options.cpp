#include "options.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "shardplan/abi/comm.h"
#include "shardplan/comm_dtype.h"
#include "shardplan/count_option.h"

namespace shardplan_bench {

const char* const kUsage =
    "usage: shardplan bench comm [options]\n"
    "\n"
    "Measures every available communication backend on every collective over a\n"
    "sweep of sizes, in one run, and prints nccl-tests style tables with\n"
    "reference rows (shared-memory roofline, raw gloo, raw MPI).\n"
    "\n"
    "options:\n"
    "  --backends LIST     comma-separated plugins, e.g. local,gloo,mpi,nccl, and\n"
    "                      gloo-tcp (gloo with option shm=off: its TCP path on\n"
    "                      one host; default: every plugin found that can run\n"
    "                      here, and gloo-tcp next to gloo)\n"
    "  --collectives LIST  all_reduce,all_gather,reduce_scatter,broadcast,\n"
    "                      all_to_all,send_recv (default: all)\n"
    "  --refs LIST         roofline,gloo-raw,mpi-raw, or none (default: all that\n"
    "                      can run with no --backends; else the roofline and the\n"
    "                      raw library under each listed backend); all_reduce only\n"
    "  --ranks N           ranks per backend (default 2)\n"
    "  --sizes MIN:MAX     total bytes, suffixes B KiB MiB GiB (K M G alike);\n"
    "                      one value for a single size (default 8B:256MiB)\n"
    "  --factor F          size multiplier between steps (default 2)\n"
    "  --iters N           timed calls per size and mode (default 20)\n"
    "  --warmup N          untimed calls at the largest size first (default 5)\n"
    "  --dtype T           float32 float64 float16 bfloat16 int8 uint8 int32 int64\n"
    "                      (default float32)\n"
    "  --check             verify every result; wrong elements are counted in\n"
    "                      #wrong and make the exit status 1\n"
    "  --csv PATH          also write the rows as CSV\n"
    "  --json PATH         also write the run and its rows as JSON\n"
    "  --plot PATH.png     busbw and latency against size per backend (gnuplot)\n"
    "  --timeout-ms T      per-operation timeout given to the backends; a worker\n"
    "                      silent for T + 30 s is killed (default 120000)\n"
    "  --plugin-dir DIR    search DIR for plugins first (repeatable)\n"
    "  --mpirun PATH       mpirun to start MPI ranks with (default: mpirun)\n"
    "  --list              print the backends and references found, and exit\n"
    "  -h, --help          print this help\n"
    "\n"
    "Columns: see docs/BENCHMARKS.md, section 'comm: all backends side by side'.\n"
    "Exit status: 0 all ran and nothing was wrong, 1 a backend failed or --check\n"
    "found wrong elements, 2 usage error.\n";

namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

[[noreturn]] void usage_error(const std::string& msg) { throw UsageError{msg}; }

int to_int(const std::string& opt, const std::string& v, int min) {
  if (auto x = shardplan::whole_number(v, min, 1000000000L)) return static_cast<int>(*x);
  usage_error(opt + " wants an integer from " + std::to_string(min) + " to 1000000000, not '" + v + "'");
}

}  // namespace

std::vector<uint64_t> SweepOptions::sizes() const {
  std::vector<uint64_t> out;
  for (uint64_t s = min_bytes; s <= max_bytes;) {
    out.push_back(s);
    const double next = std::round(static_cast<double>(s) * factor);
    if (next > static_cast<double>(max_bytes)) break;
    s = std::max<uint64_t>(s + 1, static_cast<uint64_t>(next));
  }
  return out;
}

bool parse_bytes(const std::string& text, uint64_t* bytes) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return false;
  const double value = std::atof(text.substr(0, i).c_str());
  const std::string unit = text.substr(i);
  double mult;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KiB") mult = 1024.0;
  else if (unit == "M" || unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else return false;
  const double b = value * mult;
  if (b < 1 || b > 1e15 || b != std::floor(b)) return false;
  *bytes = static_cast<uint64_t>(b);
  return true;
}

std::string human_bytes(uint64_t b) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (v == std::floor(v)) std::snprintf(buf, sizeof buf, "%.0f %s", v, units[u]);
  else std::snprintf(buf, sizeof buf, "%.3g %s", v, units[u]);
  return buf;
}

bool parse_dtype(const std::string& name, int32_t* dtype) {
  static const std::pair<const char*, int32_t> aliases[] = {
      {"float", SP_FLOAT32}, {"f32", SP_FLOAT32}, {"double", SP_FLOAT64}, {"f64", SP_FLOAT64},
      {"half", SP_FLOAT16},  {"f16", SP_FLOAT16}, {"bf16", SP_BFLOAT16},  {"int", SP_INT32},
      {"long", SP_INT64}};
  for (int32_t dt = SP_FLOAT32; dt <= SP_INT64; ++dt)
    if (name == shardplan::comm::dtype_name(dt)) {
      *dtype = dt;
      return true;
    }
  for (const auto& a : aliases)
    if (name == a.first) {
      *dtype = a.second;
      return true;
    }
  return false;
}

Options parse_options(int argc, char** argv) {
  Options o;
  o.sweep.dtype = SP_FLOAT32;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], v;
    bool has_inline = false;
    if (a.rfind("--", 0) == 0) {
      auto eq = a.find('=');
      if (eq != std::string::npos) {
        v = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_inline = true;
      }
    }
    auto value = [&]() -> std::string {
      if (has_inline) return v;
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      throw UsageError{};  // empty message: print the help
    } else if (a == "--backends") {
      o.backends = split_list(value());
      if (o.backends.empty()) usage_error("--backends needs at least one name");
    } else if (a == "--collectives") {
      o.sweep.collectives.clear();
      for (const std::string& name : split_list(value())) {
        Collective c;
        if (!parse_collective(name, &c)) usage_error("unknown collective '" + name + "'");
        o.sweep.collectives.push_back(c);
      }
      if (o.sweep.collectives.empty()) usage_error("--collectives needs at least one name");
    } else if (a == "--refs") {
      o.refs_given = true;
      o.refs.clear();
      for (const std::string& r : split_list(value())) {
        if (r == "none") continue;
        if (r != "roofline" && r != "gloo-raw" && r != "mpi-raw")
          usage_error("unknown reference '" + r + "' (roofline, gloo-raw, mpi-raw, none)");
        o.refs.push_back(r);
      }
    } else if (a == "--ranks") {
      o.ranks = to_int(a, value(), 1);
    } else if (a == "--sizes") {
      const std::string s = value();
      const auto colon = s.find(':');
      const std::string lo = s.substr(0, colon), hi = colon == std::string::npos ? lo : s.substr(colon + 1);
      if (!parse_bytes(lo, &o.sweep.min_bytes) || !parse_bytes(hi, &o.sweep.max_bytes))
        usage_error("--sizes wants MIN:MAX like 8B:256MiB, not '" + s + "'");
      if (o.sweep.min_bytes > o.sweep.max_bytes) usage_error("--sizes: MIN is larger than MAX");
    } else if (a == "--factor") {
      const std::string s = value();
      char* end = nullptr;
      o.sweep.factor = std::strtod(s.c_str(), &end);
      if (s.empty() || *end || !(o.sweep.factor > 1.0)) usage_error("--factor wants a number > 1, not '" + s + "'");
    } else if (a == "--iters") {
      o.sweep.iters = to_int(a, value(), 1);
    } else if (a == "--warmup") {
      o.sweep.warmup = to_int(a, value(), 0);
    } else if (a == "--dtype") {
      const std::string s = value();
      if (!parse_dtype(s, &o.sweep.dtype)) usage_error("unknown dtype '" + s + "'");
    } else if (a == "--check") {
      o.sweep.check = true;
    } else if (a == "--csv") {
      o.csv = value();
    } else if (a == "--json") {
      o.json = value();
    } else if (a == "--plot") {
      o.plot = value();
    } else if (a == "--timeout-ms") {
      o.sweep.timeout_ms = to_int(a, value(), 1);
    } else if (a == "--plugin-dir") {
      o.plugin_dirs.push_back(value());
    } else if (a == "--mpirun") {
      o.mpirun = value();
    } else if (a == "--list") {
      o.list = true;
      // Internal: how the coordinator starts a worker.
    } else if (a == "--worker") {
      o.worker = true;
      o.w.series = value();
    } else if (a == "--worker-kind") {
      o.w.kind = value();
    } else if (a == "--worker-launch") {
      o.w.launch = value();
    } else if (a == "--worker-plugin") {
      o.w.plugin = value();
    } else if (a == "--worker-option") {
      o.w.plugin_options.push_back(value());
    } else if (a == "--worker-cuda") {
      o.w.cuda = true;
    } else if (a == "--worker-dir") {
      o.w.dir = value();
    } else if (a == "--worker-rank") {
      o.w.rank = to_int(a, value(), 0);
    } else {
      usage_error("unknown option '" + a + "'");
    }
  }
  if (o.sweep.check && o.ranks > 40)
    usage_error("--check keeps sums exact in every dtype up to 40 ranks");
  return o;
}

std::vector<std::string> worker_args(const Options& o, const WorkerOptions& w) {
  char factor[32];
  std::snprintf(factor, sizeof factor, "%.17g", o.sweep.factor);
  std::string colls;
  for (Collective c : o.sweep.collectives) colls += std::string(colls.empty() ? "" : ",") + collective_name(c);
  std::vector<std::string> a{"--worker",        w.series,
                             "--worker-kind",   w.kind,
                             "--worker-launch", w.launch,
                             "--worker-dir",    w.dir,
                             "--ranks",         std::to_string(o.ranks),
                             "--collectives",   colls,
                             "--sizes",         std::to_string(o.sweep.min_bytes) + ":" + std::to_string(o.sweep.max_bytes),
                             "--factor",        factor,
                             "--iters",         std::to_string(o.sweep.iters),
                             "--warmup",        std::to_string(o.sweep.warmup),
                             "--dtype",         shardplan::comm::dtype_name(o.sweep.dtype),
                             "--timeout-ms",    std::to_string(o.sweep.timeout_ms)};
  if (o.sweep.check) a.push_back("--check");
  if (!w.plugin.empty()) {
    a.push_back("--worker-plugin");
    a.push_back(w.plugin);
  }
  for (const std::string& kv : w.plugin_options) {
    a.push_back("--worker-option");
    a.push_back(kv);
  }
  if (w.cuda) a.push_back("--worker-cuda");
  if (w.rank >= 0) {
    a.push_back("--worker-rank");
    a.push_back(std::to_string(w.rank));
  }
  return a;
}

}  // namespace shardplan_bench
