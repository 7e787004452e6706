#include "series.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "cuda.h"
#include "plugin.h"
#include "raw_mpi.h"
#include "shardplan/abi/comm.h"

namespace shardplan_bench {

std::string find_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0 ? program : "";
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  for (size_t b = 0; b <= p.size();) {
    size_t e = p.find(':', b);
    if (e == std::string::npos) e = p.size();
    const std::string cand = (e > b ? p.substr(b, e - b) : ".") + "/" + program;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    b = e + 1;
  }
  return {};
}

std::string Series::describe(int ranks, bool brief) const {
  const std::string n = std::to_string(ranks);
  std::string how = launch == "threads" ? n + " threads" : launch == "procs" ? n + " processes" : n + " processes (mpirun)";
  if (kind == "roofline") return how + ", a[i] += b[i] slices between spin barriers";
  if (kind == "gloo-raw") return how + ", gloo::allreduce over TCP 127.0.0.1";
  if (kind == "mpi-raw") return how + ", MPI_Allreduce on MPI_COMM_WORLD";
  std::string opts;
  for (const std::string& kv : options) opts += " " + kv;
  return how + (cuda ? ", GPU buffers" : ", CPU buffers") + (opts.empty() ? "" : ", option" + opts) +
         (brief ? "" : ", plugin " + plugin);
}

namespace {

// Presentation order: the in-process backend first, then by how far ranks
// are apart; each reference right after the backend it bounds.
int order_of(const std::string& name) {
  static const std::map<std::string, int> order{{"local", 0},    {"roofline", 1}, {"gloo", 2}, {"gloo-tcp", 3},
                                                {"gloo-raw", 4}, {"mpi", 5},      {"mpi-raw", 6}, {"nccl", 7}};
  auto it = order.find(name);
  return it == order.end() ? 100 : it->second;
}

// Why the plugin cannot run here, or "" with `s` filled in.
std::string probe_plugin(const PluginFile& f, const Options& o, Series* s) {
  const sp_comm_api* api;
  try {
    api = open_comm_plugin(f.path);
  } catch (const std::exception& e) {
    return e.what();
  }
  s->name = f.name;
  s->kind = "plugin";
  s->plugin = f.path;
  if (f.name == "mpi") {
    if (find_program(o.mpirun).empty()) return "needs " + o.mpirun + " to start its ranks (not found)";
    s->launch = "mpirun";
  } else if (api->caps & SP_CAP_PROCESS_RANKS) {
    s->launch = "procs";
  } else if (api->caps & SP_CAP_THREAD_RANKS) {
    s->launch = "threads";
  } else {
    return "declares neither thread nor process ranks";
  }
  if (!(api->caps & SP_CAP_CPU)) {
    if (!(api->caps & SP_CAP_CUDA)) return "declares neither CPU nor CUDA buffers";
    const Cuda* cuda = Cuda::get();
    const int gpus = cuda ? cuda->device_count() : 0;
    // NCCL refuses two ranks of one communicator on the same GPU.
    if (gpus < o.ranks)
      return "needs a GPU per rank: " + std::to_string(o.ranks) + " ranks, " + std::to_string(gpus) + " GPU(s)" +
             (cuda ? "" : " (no libcudart)");
    s->cuda = true;
  }
  return {};
}

// Series that run a plugin with options: gloo-tcp is the gloo plugin with its
// same-host shared memory off, so that one host shows the TCP path (the one
// between hosts) next to the shared-memory one the gloo series takes.
struct Variant {
  const char* name;
  const char* plugin;
  std::vector<std::string> options;
};
const std::vector<Variant>& variants() {
  static const std::vector<Variant> v{{"gloo-tcp", "gloo", {"shm=off"}}};
  return v;
}
const Variant* variant(const std::string& name) {
  for (const Variant& v : variants())
    if (name == v.name) return &v;
  return nullptr;
}

}  // namespace

SeriesPlan plan_series(const Options& o) {
  SeriesPlan plan;
  const std::vector<PluginFile> found = find_comm_plugins(plugin_search_path(o.plugin_dirs));
  std::vector<std::string> wanted = o.backends;
  if (wanted.empty())
    for (const PluginFile& f : found) {
      wanted.push_back(f.name);
      for (const Variant& v : variants())
        if (f.name == v.plugin) wanted.push_back(v.name);
    }

  for (const std::string& name : wanted) {
    const Variant* v = variant(name);
    const std::string file = v ? v->plugin : name;
    auto it = std::find_if(found.begin(), found.end(), [&](const PluginFile& f) { return f.name == file; });
    std::string why;
    Series s;
    if (it == found.end()) why = "no libshardplan_comm_" + file + ".so on the plugin search path";
    else why = probe_plugin(*it, o, &s);
    if (why.empty() && v) {
      s.name = v->name;
      s.options = v->options;
    }
    if (!why.empty()) {
      if (!o.backends.empty()) throw UsageError{"backend '" + name + "' cannot run here: " + why};
      plan.unavailable.push_back({name, why});
      continue;
    }
    plan.series.push_back(s);
  }

  // References: all_reduce only. By default, all that can run when no
  // backend was named; else the roofline and the raw library under each
  // named backend.
  const bool all_reduce = std::count(o.sweep.collectives.begin(), o.sweep.collectives.end(), Collective::AllReduce);
  std::vector<std::string> refs = o.refs;
  if (!o.refs_given) {
    refs = {"roofline"};
    auto named = [&](const char* b) { return o.backends.empty() || std::count(o.backends.begin(), o.backends.end(), b); };
    if (named("gloo") || named("gloo-tcp")) refs.push_back("gloo-raw");
    if (named("mpi")) refs.push_back("mpi-raw");
  }
  if (!all_reduce) {
    if (o.refs_given && !refs.empty()) throw UsageError{"references measure all_reduce only; add it to --collectives"};
    refs.clear();
  }
  for (const std::string& ref : refs) {
    Series s;
    s.name = ref;
    s.kind = ref;
    s.launch = ref == "roofline" ? "threads" : ref == "gloo-raw" ? "procs" : "mpirun";
    std::string why;
    if (ref == "mpi-raw" && !have_raw_mpi()) why = "this build has no MPI (CMake did not find it)";
    else if (ref == "mpi-raw" && find_program(o.mpirun).empty()) why = o.mpirun + " not found";
    if (!why.empty()) {
      if (o.refs_given) throw UsageError{"reference '" + ref + "' cannot run here: " + why};
      plan.unavailable.push_back({ref, why});
      continue;
    }
    plan.series.push_back(s);
  }
  std::stable_sort(plan.series.begin(), plan.series.end(),
                   [](const Series& a, const Series& b) { return order_of(a.name) < order_of(b.name); });
  return plan;
}

}  // namespace shardplan_bench
