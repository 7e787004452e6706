// bench_comm_gloo: the gloo plugin's all_reduce, driven through the C ABI,
// against gloo::allreduce called directly, in the same run, on identical
// buffers (float32, sum, in place), with the ranks as fork()ed processes
// talking TCP over loopback.
//
//   bench_comm_gloo [--ranks N] [--scale S] [--min-bytes B] [--max-bytes B] [--plugin PATH] [--control]
//                   [--blocking worker|inline] [--shm off|auto|on] [--tcp-all-reduce auto|ring]
//
// Blocks of calls through the plugin and through raw gloo alternate
// (tools/bench/comm/interleaved.h); the table gives the median time per call
// of each side and the median over neighbouring pairs of blocks of the ratio
// raw/plugin: plugin throughput as a fraction of raw gloo's (1.00 = no
// overhead). --scale multiplies the blocks. --control measures raw gloo
// against itself (a second context) instead of the plugin: the spread of its
// ratio column is the noise floor. `shardplan bench comm` shows raw gloo next
// to every backend, one series after the other; this program stays for the
// interleaved ratio. --blocking picks the plugin's option of that name:
// worker (the default, a thread hop per call) or inline (on the caller, as
// raw gloo runs). --shm likewise: off (the default here, so both sides move
// bytes over TCP and the ratio is the plugin's own overhead) or auto/on (the
// plugin's same-host shared-memory path against raw gloo's TCP).
// --tcp-all-reduce likewise: auto (the default: at 2 ranks the plugin's
// pairwise exchange, plugins/comm_gloo/tcp_all_reduce.h) or ring (gloo's
// ring, as raw gloo runs it), to measure the plugin before and after.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "interleaved.h"
#include "plugin.h"
#include "raw_gloo.h"
#include "shardplan/abi/comm.h"

namespace {

constexpr int64_t kTimeoutMs = 120000;

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "bench_comm_gloo: %s\n", msg.c_str());
  std::fflush(stderr);
  ::_exit(1);
}

const sp_comm_api* load_plugin(const std::string& path) {
  try {
    return shardplan_bench::open_comm_plugin(path);
  } catch (const std::exception& e) {
    die(e.what());
  }
}

struct Ranks {
  int rank;
  int size;
  std::string dir;
};

// What a program using gloo by hand writes (shardplan_bench::RawGloo: one
// TCP device, a context met through a FileStore, gloo's own sum kernel, a
// fresh tag per call).
class Raw final : public shardplan_bench::ReduceSide {
 public:
  Raw(const Ranks& r, const std::string& name)
      : gloo_(r.rank, r.size, r.dir, name, std::chrono::milliseconds(kTimeoutMs)) {}
  void all_reduce(float* data, size_t n) override { gloo_.all_reduce(data, data, n, SP_FLOAT32); }
  void barrier() override { gloo_.barrier(); }

 private:
  shardplan_bench::RawGloo gloo_;
};

// control: the "plugin" side is a second raw gloo context, so the ratio
// column shows what noise alone does to it on this machine.
void run_rank(const Ranks& r, const sp_comm_api* api, const shardplan_bench::InterleavedArgs& args,
              const std::string& blocking, const std::string& shm, const std::string& algo) {
  const bool control = args.control;
  std::unique_ptr<shardplan_bench::ReduceSide> tested;
  if (control) tested = std::make_unique<Raw>(r, "control");
  else
    tested = std::make_unique<shardplan_bench::PluginReduceSide>(
        api, r.rank, r.size, kTimeoutMs, std::vector<std::string>{"file_store=" + r.dir + "/plugin", "local_addr=127.0.0.1", "blocking=" + blocking, "shm=" + shm, "tcp_all_reduce=" + algo});
  Raw raw(r, "raw");
  shardplan_bench::InterleavedOptions o = args.options;
  o.rank = r.rank;
  o.size = r.size;
  o.tested_name = control ? "control" : "plugin (blocking=" + blocking + ", shm=" + shm + ", tcp_all_reduce=" + algo + ")";
  o.raw_name = "raw gloo";
  o.title = "all_reduce float32 sum in place, " + std::to_string(r.size) +
            " ranks (processes), gloo TCP over 127.0.0.1" +
            (control ? "; CONTROL: raw gloo against a second raw gloo context" : "");
  shardplan_bench::run_interleaved(*tested, raw, o);
}

int usage() {
  std::fprintf(stderr, "usage: bench_comm_gloo [--ranks N] [--scale S] [--min-bytes B] [--max-bytes B] [--plugin PATH] [--control]\n"
                       "                       [--blocking worker|inline] [--shm off|auto|on] [--tcp-all-reduce auto|ring]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  shardplan_bench::InterleavedArgs args;
  args.plugin = SHARDPLAN_GLOO_PLUGIN;
  args.options.min_bytes = 4096;
  int ranks = 2;
  // --blocking, --shm and --tcp-all-reduce are ours; the shared parser takes the rest.
  std::string blocking = "worker", shm = "off", algo = "auto";
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--blocking" && i + 1 < argc) {
      blocking = argv[++i];
      if (blocking != "worker" && blocking != "inline") return usage();
    } else if (std::string(argv[i]) == "--shm" && i + 1 < argc) {
      shm = argv[++i];
      if (shm != "off" && shm != "auto" && shm != "on") return usage();
    } else if (std::string(argv[i]) == "--tcp-all-reduce" && i + 1 < argc) {
      algo = argv[++i];
      if (algo != "auto" && algo != "ring") return usage();
    } else {
      rest.push_back(argv[i]);
    }
  }
  std::string why;
  if (!shardplan_bench::parse_interleaved_args(static_cast<int>(rest.size()), rest.data(), args, &ranks, &why)) {
    if (!why.empty()) std::fprintf(stderr, "bench_comm_gloo: %s\n", why.c_str());
    return usage();
  }

  char tmpl[] = "/tmp/bench_comm_gloo.XXXXXX";
  if (!::mkdtemp(tmpl)) die("mkdtemp failed");
  const std::string dir = tmpl;
  const sp_comm_api* api = load_plugin(args.plugin);
  std::fflush(stdout);

  std::vector<pid_t> children;
  for (int r = 1; r < ranks; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) die("fork failed");
    if (pid == 0) {
      try {
        run_rank({r, ranks, dir}, api, args, blocking, shm, algo);
      } catch (const std::exception& e) {
        die(std::string("rank ") + std::to_string(r) + ": " + e.what());
      }
      std::fflush(stdout);
      ::_exit(0);
    }
    children.push_back(pid);
  }
  int rc = 0;
  try {
    run_rank({0, ranks, dir}, api, args, blocking, shm, algo);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_comm_gloo: %s\n", e.what());
    rc = 1;
  }
  for (pid_t pid : children) {
    if (rc) ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  std::filesystem::remove_all(dir);
  return rc;
}
