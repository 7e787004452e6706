// bench_comm_nccl: the nccl plugin's all_reduce, driven through the C ABI,
// against ncclAllReduce called directly on a communicator of its own, at world
// size 1 on one GPU (float32, sum, in place).
//
//   bench_comm_nccl [--device D] [--iters N] [--max-bytes B] [--plugin PATH]
//
// Per size: `iters` calls issued back to back (async through the plugin, each
// handle released at once but the last, which is waited for; raw: enqueued on
// a stream, then synchronized), after as many warm-up calls; plus the
// plugin's blocking call (work == NULL), whose time includes the host waiting
// for the GPU each time. algbw = bytes / time; busbw = algbw * 2(n-1)/n as
// nccl-tests defines it, which is 0 at world size 1: a one-rank all_reduce
// moves no data, so these rows measure per-call overhead and launch latency,
// not bandwidth. Exits 0 with a SKIPPED line where there is no CUDA device.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "shardplan/abi/comm.h"
#include "shardplan/abi/plugin.h"
#include "shardplan/count_option.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "bench_comm_nccl: %s\n", msg.c_str());
  std::exit(1);
}

void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}

void nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) die(std::string(what) + ": " + ncclGetErrorString(r));
}

const sp_comm_api* load_plugin(const std::string& path) {
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) die("cannot load " + path + ": " + ::dlerror());
  auto entry = reinterpret_cast<sp_plugin_entry_fn>(::dlsym(lib, SP_PLUGIN_ENTRY_SYMBOL));
  if (!entry) die(path + " has no " SP_PLUGIN_ENTRY_SYMBOL);
  const sp_plugin_info* info = entry();
  if (info->entry_version != SP_PLUGIN_ENTRY_VERSION || info->kind != SP_PLUGIN_COMM ||
      info->abi_version != SP_COMM_ABI_VERSION)
    die(path + " is not a comm plugin of ABI version " + std::to_string(SP_COMM_ABI_VERSION));
  return static_cast<const sp_comm_api*>(info->factory());
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string human(size_t bytes) {
  if (bytes >= (1u << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1u << 10)) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--device D] [--iters N] [--max-bytes B] [--plugin PATH]\n", argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0, iters = 200;
  size_t max_bytes = size_t{256} << 20;
  std::string path = SHARDPLAN_NCCL_PLUGIN;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (!v) return usage(argv[0]);
    ++i;
    if (a == "--device") device = static_cast<int>(shardplan::count_or_exit(argv[0], a, v, 0, 1023));
    else if (a == "--iters") iters = static_cast<int>(shardplan::count_or_exit(argv[0], a, v, 1, INT_MAX));
    else if (a == "--max-bytes") max_bytes = shardplan::count_or_exit(argv[0], a, v, 4, LLONG_MAX);
    else if (a == "--plugin") path = v;
    else return usage(argv[0]);
  }

  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count <= device) {
    std::printf("SKIPPED: no CUDA device %d: cudaGetDeviceCount returned %s\n", device,
                e != cudaSuccess ? cudaGetErrorString(e) : (std::to_string(count) + " device(s)").c_str());
    return 0;
  }
  cuda(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop{};
  cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  int nccl_version = 0;
  ncclGetVersion(&nccl_version);

  const sp_comm_api* api = load_plugin(path);
  const std::string dev_opt = "device=" + std::to_string(device);
  const char* opts[] = {dev_opt.c_str(), nullptr};
  sp_comm_config cfg{};
  cfg.struct_size = sizeof cfg;
  cfg.rank = 0;
  cfg.world_size = 1;
  cfg.timeout_ms = 120000;
  cfg.options = opts;
  sp_comm* comm = nullptr;
  if (api->create(&cfg, &comm) != SP_OK) die(std::string("plugin create: ") + api->last_error());

  ncclUniqueId id;
  nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ncclComm_t raw = nullptr;
  nccl(ncclCommInitRank(&raw, 1, id, 0), "ncclCommInitRank");
  cudaStream_t stream = nullptr;
  cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  void* buf = nullptr;
  cuda(cudaMalloc(&buf, max_bytes), "cudaMalloc");
  cuda(cudaMemset(buf, 0, max_bytes), "cudaMemset");

  std::printf("nccl all_reduce, float32 sum, in place, world size 1, cuda:%d %s, NCCL %d, %d calls per size\n",
              device, prop.name, nccl_version, iters);
  std::printf("| size | plugin async us/call | raw NCCL us/call | plugin/raw time | plugin blocking us/call | "
              "plugin algbw GB/s | busbw GB/s |\n|---|---|---|---|---|---|---|\n");

  for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 16) {
    const uint64_t n = bytes / sizeof(float);
    sp_buffer b{};
    b.data = buf;
    b.count = n;
    b.dtype = SP_FLOAT32;
    b.device_type = SP_DEVICE_CUDA;
    b.device_index = device;

    auto plugin_async = [&](int calls) {
      const auto t0 = Clock::now();
      sp_work* w = nullptr;
      for (int i = 0; i < calls; ++i) {
        if (w) api->release(w);
        if (api->all_reduce(comm, &b, &b, SP_SUM, &w) != SP_OK) die(std::string("all_reduce: ") + api->last_error());
      }
      if (api->wait(w, -1) != SP_OK) die(std::string("wait: ") + api->last_error());
      api->release(w);
      return seconds_since(t0) / calls;
    };
    auto plugin_blocking = [&](int calls) {
      const auto t0 = Clock::now();
      for (int i = 0; i < calls; ++i)
        if (api->all_reduce(comm, &b, &b, SP_SUM, nullptr) != SP_OK)
          die(std::string("all_reduce: ") + api->last_error());
      return seconds_since(t0) / calls;
    };
    auto raw_async = [&](int calls) {
      const auto t0 = Clock::now();
      for (int i = 0; i < calls; ++i) nccl(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, raw, stream), "ncclAllReduce");
      cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      return seconds_since(t0) / calls;
    };

    plugin_async(iters);
    raw_async(iters);
    plugin_blocking(std::max(1, iters / 4));
    // Interleaved, best of three: other work on the GPU or the host hits both.
    double p = 1e30, r = 1e30, pb = 1e30;
    for (int k = 0; k < 3; ++k) {
      p = std::min(p, plugin_async(iters));
      r = std::min(r, raw_async(iters));
      pb = std::min(pb, plugin_blocking(std::max(1, iters / 4)));
    }
    const int world = 1;
    const double algbw = bytes / p / 1e9, busbw = algbw * 2.0 * (world - 1) / world;
    std::printf("| %s | %.2f | %.2f | %.3f | %.2f | %.2f | %.2f |\n", human(bytes).c_str(), p * 1e6, r * 1e6, p / r,
                pb * 1e6, algbw, busbw);
    std::fflush(stdout);
  }

  cudaFree(buf);
  cudaStreamDestroy(stream);
  ncclCommDestroy(raw);
  api->destroy(comm);
  return 0;
}
