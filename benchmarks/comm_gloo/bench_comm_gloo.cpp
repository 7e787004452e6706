// bench_comm_gloo: the gloo plugin's all_reduce, driven through the C ABI,
// against gloo::allreduce called directly, in the same run, on identical
// buffers (float32, sum, in place), with the ranks as fork()ed processes
// talking TCP over loopback.
//
//   bench_comm_gloo [--ranks N] [--scale S] [--max-bytes B] [--plugin PATH] [--control]
//
// Per size, blocks of calls through the plugin and through raw gloo alternate
// (plugin, raw, raw, plugin, ...), each block starting after a barrier. The
// table gives the median time per call of each side and the median over
// neighbouring pairs of blocks of the ratio raw/plugin: plugin throughput as a
// fraction of raw gloo's (1.00 = no overhead). --scale multiplies the blocks.
// --control measures raw gloo against itself (a second context) instead of
// the plugin: the spread of its ratio column is the noise floor.
// `shardplan bench comm` shows raw gloo next to every backend; this program
// stays for its interleaved plugin/raw ratio. Plugin loading and raw gloo
// come from that suite (tools/bench/comm).
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

#include "plugin.h"
#include "raw_gloo.h"
#include "shardplan/abi/comm.h"
#include "stats.h"

namespace {

using Clock = std::chrono::steady_clock;
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

class Side {
 public:
  virtual ~Side() = default;
  virtual void all_reduce(float* data, size_t n) = 0;
  virtual void barrier() = 0;
};

class Plugin final : public Side {
 public:
  Plugin(const sp_comm_api* api, const Ranks& r) : api_(api) {
    std::string store = "file_store=" + r.dir + "/plugin";
    const char* options[] = {store.c_str(), "local_addr=127.0.0.1", nullptr};
    sp_comm_config cfg{};
    cfg.struct_size = sizeof cfg;
    cfg.rank = r.rank;
    cfg.world_size = r.size;
    cfg.timeout_ms = kTimeoutMs;
    cfg.options = options;
    if (api_->create(&cfg, &comm_) != SP_OK) die(std::string("plugin create: ") + api_->last_error());
  }
  ~Plugin() override { api_->destroy(comm_); }

  void all_reduce(float* data, size_t n) override {
    sp_buffer b{};
    b.data = data;
    b.count = n;
    b.dtype = SP_FLOAT32;
    b.device_type = SP_DEVICE_CPU;
    if (api_->all_reduce(comm_, &b, &b, SP_SUM, nullptr) != SP_OK) die(api_->last_error());
  }
  void barrier() override {
    if (api_->barrier(comm_, nullptr) != SP_OK) die(api_->last_error());
  }

 private:
  const sp_comm_api* api_;
  sp_comm* comm_ = nullptr;
};

// What a program using gloo by hand writes (shardplan_bench::RawGloo: one
// TCP device, a context met through a FileStore, gloo's own sum kernel, a
// fresh tag per call).
class Raw final : public Side {
 public:
  Raw(const Ranks& r, const std::string& name)
      : gloo_(r.rank, r.size, r.dir, name, std::chrono::milliseconds(kTimeoutMs)) {}
  void all_reduce(float* data, size_t n) override { gloo_.all_reduce(data, data, n, SP_FLOAT32); }
  void barrier() override { gloo_.barrier(); }

 private:
  shardplan_bench::RawGloo gloo_;
};

// Calls per block and blocks per side; equal on every rank, so they may not
// depend on local timing.
int calls_per_block(size_t bytes) { return static_cast<int>(std::clamp<size_t>((size_t(4) << 20) / bytes, 1, 20)); }
int blocks_for(size_t bytes, int scale) {
  size_t per_block = bytes * calls_per_block(bytes);
  return static_cast<int>(std::clamp<size_t>((size_t(128) << 20) * scale / per_block, 8, 100 * scale));
}

// Mean time per call over one block. The barrier first lets both ranks start
// together, so a late rank does not bill its delay to the other side.
double time_block(Side& b, std::vector<float>& buf, int calls) {
  b.barrier();
  auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i) b.all_reduce(buf.data(), buf.size());
  return std::chrono::duration<double>(Clock::now() - t0).count() / calls;
}

void check_sum(Side& b, const Ranks& r, const char* name) {
  std::vector<float> v(1027, float(r.rank + 1));
  b.all_reduce(v.data(), v.size());
  float want = float(r.size * (r.size + 1) / 2);
  for (float x : v)
    if (x != want) die(std::string(name) + " all_reduce gave " + std::to_string(x) + ", expected " + std::to_string(want));
}

double median(const std::vector<double>& v) { return shardplan_bench::median_of(v); }

std::string human(size_t bytes) {
  char buf[32];
  if (bytes >= (1u << 20)) std::snprintf(buf, sizeof buf, "%zu MiB", bytes >> 20);
  else std::snprintf(buf, sizeof buf, "%zu KiB", bytes >> 10);
  return buf;
}

// control: the "plugin" side is a second raw gloo context, so the ratio
// column shows what noise alone does to it on this machine.
void run_rank(const Ranks& r, const sp_comm_api* api, int scale, size_t max_bytes, bool control) {
  std::unique_ptr<Side> tested;
  if (control) tested = std::make_unique<Raw>(r, "control");
  else tested = std::make_unique<Plugin>(api, r);
  Raw reference(r, "raw");
  Side& plugin = *tested;
  Side& raw = reference;
  check_sum(plugin, r, control ? "control" : "plugin");
  check_sum(raw, r, "raw gloo");

  if (r.rank == 0) {
    std::printf("all_reduce float32 sum in place, %d ranks (processes), gloo TCP over 127.0.0.1%s\n", r.size,
                control ? "; CONTROL: raw gloo against a second raw gloo context" : "");
    const std::string name = control ? "control" : "plugin";
    std::printf("%9s %5s %6s %14s %14s %10s %12s %11s\n", "size", "calls", "blocks", "raw gloo (us)",
                (name + " (us)").c_str(), "raw GB/s", (name + " GB/s").c_str(), (name + "/raw").c_str());
  }
  for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    std::vector<float> a(bytes / sizeof(float), 0.0f), b(bytes / sizeof(float), 0.0f);
    const int calls = calls_per_block(bytes), blocks = blocks_for(bytes, scale);
    time_block(plugin, a, calls);  // warm-up: first touch, socket buffers
    time_block(raw, b, calls);
    // Blocks alternate (plugin, raw, raw, plugin, ...), and each plugin block
    // is compared with its neighbour: load that comes and goes on a shared
    // machine falls on both sides of a pair alike.
    std::vector<double> tp, tr, ratio;
    for (int k = 0; k < blocks; ++k) {
      double p, w;
      if (k % 2 == 0) {
        p = time_block(plugin, a, calls);
        w = time_block(raw, b, calls);
      } else {
        w = time_block(raw, b, calls);
        p = time_block(plugin, a, calls);
      }
      tp.push_back(p);
      tr.push_back(w);
      ratio.push_back(w / p);
    }
    if (r.rank == 0) {
      double p = median(tp), w = median(tr);
      std::printf("%9s %5d %6d %14.1f %14.1f %10.3f %12.3f %11.2f\n", human(bytes).c_str(), calls, blocks, w * 1e6,
                  p * 1e6, bytes / w / 1e9, bytes / p / 1e9, median(ratio));
      std::fflush(stdout);
    }
  }
}

int usage() {
  std::fprintf(stderr, "usage: bench_comm_gloo [--ranks N] [--scale S] [--max-bytes B] [--plugin PATH] [--control]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2, scale = 1;
  bool control = false;
  size_t max_bytes = size_t(64) << 20;
  std::string plugin_path = SHARDPLAN_GLOO_PLUGIN;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--control") {
      control = true;
      continue;
    }
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (!v) return usage();
    ++i;
    if (a == "--ranks") ranks = std::atoi(v);
    else if (a == "--scale") scale = std::atoi(v);
    else if (a == "--max-bytes") max_bytes = std::strtoull(v, nullptr, 10);
    else if (a == "--plugin") plugin_path = v;
    else return usage();
  }
  if (ranks < 1 || scale < 1 || max_bytes < 4096) return usage();

  char tmpl[] = "/tmp/bench_comm_gloo.XXXXXX";
  if (!::mkdtemp(tmpl)) die("mkdtemp failed");
  const std::string dir = tmpl;
  const sp_comm_api* api = load_plugin(plugin_path);
  std::fflush(stdout);

  std::vector<pid_t> children;
  for (int r = 1; r < ranks; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) die("fork failed");
    if (pid == 0) {
      try {
        run_rank({r, ranks, dir}, api, scale, max_bytes, control);
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
    run_rank({0, ranks, dir}, api, scale, max_bytes, control);
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
