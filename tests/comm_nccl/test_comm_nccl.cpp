// Tests of the nccl comm plugin, torch-free: the plugin is dlopen()ed and
// driven through the C ABI, on CUDA device memory, by the conformance suite in
// device mode (tests/comm/conformance.h, Options::memory).
//
//   comm_nccl_tests --gtest_filter='NcclPlugin.*'    no GPU needed: loading,
//                                                    config errors
//   comm_nccl_tests --gtest_filter='NcclWorld1.*'    world size 1, first GPU
//   shardplan launch -n N -- comm_nccl_tests --gtest_filter='NcclMultiRank.*'
//                                                    world size N, a GPU per rank
//
// GPU tests skip with the reason (GTEST_SKIP) where the machine has too few
// CUDA devices, as CI does; they never fail for that.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "conformance.h"
#include "shardplan/abi/comm.h"
#include "shardplan/abi/plugin.h"

namespace {

namespace conf = shardplan::conformance;
constexpr int64_t kTimeoutMs = 120000;

const sp_comm_api* plugin() {
  static const sp_comm_api* api = [] {
    void* lib = ::dlopen(SHARDPLAN_NCCL_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    if (!lib) throw std::runtime_error(std::string("cannot load " SHARDPLAN_NCCL_PLUGIN ": ") + ::dlerror());
    auto entry = reinterpret_cast<sp_plugin_entry_fn>(::dlsym(lib, SP_PLUGIN_ENTRY_SYMBOL));
    if (!entry) throw std::runtime_error(SHARDPLAN_NCCL_PLUGIN " has no " SP_PLUGIN_ENTRY_SYMBOL);
    const sp_plugin_info* info = entry();
    if (info->entry_version != SP_PLUGIN_ENTRY_VERSION || info->kind != SP_PLUGIN_COMM ||
        info->abi_version != SP_COMM_ABI_VERSION)
      throw std::runtime_error(SHARDPLAN_NCCL_PLUGIN " is not a comm plugin of this ABI");
    return static_cast<const sp_comm_api*>(info->factory());
  }();
  return api;
}

// The number of CUDA devices, or the reason there are none.
int device_count(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    *why = std::string("no CUDA device: cudaGetDeviceCount returned ") + cudaGetErrorName(e) + " (" +
           cudaGetErrorString(e) + ")";
    return 0;
  }
  if (n == 0) *why = "no CUDA device: cudaGetDeviceCount returned 0 devices";
  return n;
}

#define SKIP_UNLESS_DEVICES(n)                                                                     \
  do {                                                                                             \
    std::string why_;                                                                              \
    const int have_ = device_count(&why_);                                                         \
    if (have_ == 0) GTEST_SKIP() << why_;                                                          \
    if (have_ < (n)) GTEST_SKIP() << "needs " << (n) << " CUDA devices, this machine has " << have_; \
  } while (0)

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Device memory for the conformance suite. Copies go through a private
// non-blocking stream, so they never order the plugin's work for it: a missing
// stream dependency inside the plugin shows as wrong data instead of being
// hidden by the legacy default stream's implicit synchronization.
class DeviceMemory {
 public:
  DeviceMemory(int device, cudaStream_t op_stream) {
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    cuda_check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreate");
    memory.device_type = SP_DEVICE_CUDA;
    memory.device_index = device;
    memory.stream = op_stream;
    cudaStream_t s = copy_;
    memory.alloc = [](size_t bytes) {
      void* p = nullptr;
      cuda_check(cudaMalloc(&p, bytes), "cudaMalloc");
      return p;
    };
    memory.free = [](void* p) { cudaFree(p); };
    memory.upload = [s](void* dev, const void* host, size_t bytes) {
      cuda_check(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync to the device");
      cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    };
    memory.download = [s](void* host, const void* dev, size_t bytes) {
      cuda_check(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync to the host");
      cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    };
  }
  ~DeviceMemory() { cudaStreamDestroy(copy_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  conf::Memory memory;

 private:
  cudaStream_t copy_ = nullptr;
};

sp_comm* create(const sp_store* store, int rank, int size, std::vector<std::string> options = {}) {
  std::vector<const char*> opts;
  for (const auto& o : options) opts.push_back(o.c_str());
  opts.push_back(nullptr);
  sp_comm_config cfg{};
  cfg.struct_size = sizeof cfg;
  cfg.rank = rank;
  cfg.world_size = size;
  cfg.timeout_ms = kTimeoutMs;
  cfg.store = store;
  cfg.options = opts.data();
  sp_comm* comm = nullptr;
  int st = plugin()->create(&cfg, &comm);
  if (st != SP_OK) ADD_FAILURE() << "create returned " << st << ": " << plugin()->last_error();
  return comm;
}

void expect_conformance(sp_comm* comm, const conf::Options& options) {
  conf::Result r = conf::run_conformance(plugin(), comm, options);
  for (const auto& f : r.failures) ADD_FAILURE() << f;
  EXPECT_EQ(r.failed, 0) << r.passed << " checks passed";
  EXPECT_GT(r.passed, 0);
  std::printf("conformance: %d passed, %d failed\n", r.passed, r.failed);
}

conf::Options nccl_options() {
  conf::Options o;
  o.p2p_tag_matching = false;  // NCCL matches messages in issue order only
  o.wait_timeout_ms = kTimeoutMs;
  return o;
}

sp_buffer device_buffer(void* data, uint64_t count, int device) {
  sp_buffer b{};
  b.data = data;
  b.count = count;
  b.dtype = SP_FLOAT32;
  b.device_type = SP_DEVICE_CUDA;
  b.device_index = device;
  return b;
}

// ------------------------------------------------------------ no GPU needed

TEST(NcclPlugin, LoadsAndDescribesItself) {
  const sp_comm_api* api = plugin();
  ASSERT_NE(api, nullptr);
  EXPECT_STREQ(api->name, "nccl");
  EXPECT_EQ(api->abi_version, SP_COMM_ABI_VERSION);
  EXPECT_GE(api->struct_size, sizeof(sp_comm_api));
  EXPECT_TRUE(api->caps & SP_CAP_CUDA);
  EXPECT_TRUE(api->caps & SP_CAP_PROCESS_RANKS);
  EXPECT_FALSE(api->caps & SP_CAP_CPU);
  for (auto fn : {(void*)api->create, (void*)api->split, (void*)api->abort, (void*)api->destroy, (void*)api->rank,
                  (void*)api->size, (void*)api->all_reduce, (void*)api->all_gather, (void*)api->reduce_scatter,
                  (void*)api->broadcast, (void*)api->scatter, (void*)api->gather, (void*)api->all_to_all,
                  (void*)api->send, (void*)api->recv, (void*)api->barrier, (void*)api->wait, (void*)api->test,
                  (void*)api->release, (void*)api->last_error})
    EXPECT_NE(fn, nullptr);
}

TEST(NcclPlugin, RejectsBadConfigBeforeTouchingCuda) {
  const sp_comm_api* api = plugin();
  sp_comm* comm = nullptr;
  sp_comm_config cfg{};
  cfg.struct_size = sizeof cfg;
  cfg.rank = 2;
  cfg.world_size = 2;
  EXPECT_EQ(api->create(&cfg, &comm), SP_ERR_INVALID);
  EXPECT_NE(std::string(api->last_error()).find("rank 2 of world size 2"), std::string::npos) << api->last_error();
  EXPECT_EQ(comm, nullptr);

  const char* opts[] = {"device=gpu0", nullptr};
  cfg.rank = 0;
  cfg.world_size = 1;
  cfg.options = opts;
  EXPECT_EQ(api->create(&cfg, &comm), SP_ERR_INVALID);
  EXPECT_NE(std::string(api->last_error()).find("device=gpu0"), std::string::npos) << api->last_error();
  EXPECT_EQ(api->create(&cfg, nullptr), SP_ERR_INVALID);
  EXPECT_EQ(api->split(nullptr, 0, 0, &comm), SP_ERR_INVALID);
  EXPECT_EQ(api->all_reduce(nullptr, nullptr, nullptr, SP_SUM, nullptr), SP_ERR_INVALID);
  EXPECT_EQ(api->wait(nullptr, 0), SP_ERR_INVALID);
}

// What a CPU-only machine (CI) gets from create: a clear refusal.
TEST(NcclPlugin, CreateWithoutDeviceSaysSo) {
  std::string why;
  if (device_count(&why) > 0) GTEST_SKIP() << "this machine has a CUDA device; NcclWorld1 covers create";
  sp_comm_config cfg{};
  cfg.struct_size = sizeof cfg;
  cfg.rank = 0;
  cfg.world_size = 1;
  sp_comm* comm = nullptr;
  EXPECT_EQ(plugin()->create(&cfg, &comm), SP_ERR_UNSUPPORTED);
  EXPECT_EQ(comm, nullptr);
  const std::string msg = plugin()->last_error();
  EXPECT_NE(msg.find("nccl create"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no CUDA device"), std::string::npos) << msg;
  std::printf("create without a GPU: %s\n", msg.c_str());
}

// --------------------------------------------------------- world size 1

TEST(NcclWorld1, Conformance) {
  SKIP_UNLESS_DEVICES(1);
  DeviceMemory mem(0, nullptr);
  sp_comm* comm = create(nullptr, 0, 1, {"device=0"});
  ASSERT_NE(comm, nullptr);
  conf::Options o = nccl_options();
  o.memory = mem.memory;
  expect_conformance(comm, o);
  plugin()->destroy(comm);
}

// Buffers carrying the caller's stream, and splits through the store path
// (the one NCCL < 2.18 takes).
TEST(NcclWorld1, ConformanceOnCallerStreamAndStoreSplit) {
  SKIP_UNLESS_DEVICES(1);
  cuda_check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  {
    DeviceMemory mem(0, stream);
    sp_comm* comm = create(nullptr, 0, 1, {"split=store"});
    ASSERT_NE(comm, nullptr);
    conf::Options o = nccl_options();
    o.counts = {0, 7, 1023};
    o.memory = mem.memory;
    expect_conformance(comm, o);
    plugin()->destroy(comm);
  }
  cudaStreamDestroy(stream);
}

TEST(NcclWorld1, RefusesHostAndForeignBuffers) {
  SKIP_UNLESS_DEVICES(1);
  const sp_comm_api* api = plugin();
  sp_comm* comm = create(nullptr, 0, 1, {"device=0"});
  ASSERT_NE(comm, nullptr);
  std::vector<float> host(8, 1.0f);
  sp_buffer b = device_buffer(host.data(), host.size(), 0);
  b.device_type = SP_DEVICE_CPU;
  EXPECT_EQ(api->all_reduce(comm, &b, &b, SP_SUM, nullptr), SP_ERR_UNSUPPORTED);
  std::string msg = api->last_error();
  EXPECT_NE(msg.find("all_reduce"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CPU"), std::string::npos) << msg;

  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 64), cudaSuccess);
  sp_buffer d = device_buffer(dev, 8, 1);  // claims another GPU
  EXPECT_EQ(api->broadcast(comm, &d, &d, 0, nullptr), SP_ERR_INVALID);
  msg = api->last_error();
  EXPECT_NE(msg.find("cuda:1"), std::string::npos) << msg;
  d.device_index = 0;
  EXPECT_EQ(api->broadcast(comm, &d, &d, 1, nullptr), SP_ERR_INVALID);  // root outside the group
  EXPECT_EQ(api->all_reduce(comm, &d, &d, 42, nullptr), SP_ERR_INVALID);
  EXPECT_NE(std::string(api->last_error()).find("reduce op 42"), std::string::npos) << api->last_error();
  cudaFree(dev);
  api->destroy(comm);
}

TEST(NcclWorld1, AbortFailsLaterOperations) {
  SKIP_UNLESS_DEVICES(1);
  const sp_comm_api* api = plugin();
  sp_comm* comm = create(nullptr, 0, 1, {"device=0"});
  ASSERT_NE(comm, nullptr);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 1024 * sizeof(float)), cudaSuccess);
  sp_buffer d = device_buffer(dev, 1024, 0);
  sp_work* w = nullptr;
  ASSERT_EQ(api->all_reduce(comm, &d, &d, SP_SUM, &w), SP_OK) << api->last_error();
  EXPECT_EQ(api->wait(w, kTimeoutMs), SP_OK) << api->last_error();
  api->release(w);
  EXPECT_EQ(api->abort(comm), SP_OK);
  EXPECT_EQ(api->all_reduce(comm, &d, &d, SP_SUM, nullptr), SP_ERR_ABORTED);
  EXPECT_NE(std::string(api->last_error()).find("aborted"), std::string::npos) << api->last_error();
  EXPECT_EQ(api->barrier(comm, nullptr), SP_ERR_ABORTED);
  api->destroy(comm);
  cudaFree(dev);
}

// ------------------------------------------------------ several processes

// The single-node launcher's rendezvous is a directory it removes at exit
// (SHARDPLAN_STORE=file://<dir>/store); this test keeps its keys as files
// next to it, one per key, written by rename so a reader never sees half.
class DirStore {
 public:
  explicit DirStore(std::string dir) : dir_(std::move(dir)) {
    std::filesystem::create_directories(dir_);
    abi_.ctx = this;
    abi_.set = &set;
    abi_.get = &get;
    abi_.check = &check;
    abi_.last_error = &last_error;
  }
  const sp_store* abi() const { return &abi_; }

 private:
  std::string path(const char* key) const {
    std::string name;
    for (const char* c = key; *c; ++c) {
      const unsigned char u = static_cast<unsigned char>(*c);
      if (std::isalnum(u) || u == '-' || u == '.' || u == '_') {
        name += *c;
      } else {
        char hex[4];
        std::snprintf(hex, sizeof hex, "%%%02X", u);
        name += hex;
      }
    }
    return dir_ + "/" + name;
  }
  static int set(void* ctx, const char* key, const void* data, size_t len) {
    auto* s = static_cast<DirStore*>(ctx);
    const std::string final_path = s->path(key), tmp = final_path + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream f(tmp, std::ios::binary);
      f.write(static_cast<const char*>(data), static_cast<std::streamsize>(len));
      if (!f) return s->error("cannot write " + tmp);
    }
    std::error_code ec;
    std::filesystem::rename(tmp, final_path, ec);
    return ec ? s->error("cannot rename " + tmp + ": " + ec.message()) : 0;
  }
  static int get(void* ctx, const char* key, void** data, size_t* len, int64_t timeout_ms) {
    auto* s = static_cast<DirStore*>(ctx);
    const std::string p = s->path(key);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!std::filesystem::exists(p)) {
      if (timeout_ms >= 0 && std::chrono::steady_clock::now() > deadline) {
        s->error("timed out after " + std::to_string(timeout_ms) + " ms waiting for key '" + key + "'");
        return SP_ERR_TIMEOUT;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::ifstream f(p, std::ios::binary);
    std::string v((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    *len = v.size();
    *data = std::malloc(v.size() ? v.size() : 1);
    std::memcpy(*data, v.data(), v.size());
    return 0;
  }
  static int check(void* ctx, const char* key, int* exists) {
    *exists = std::filesystem::exists(static_cast<DirStore*>(ctx)->path(key)) ? 1 : 0;
    return 0;
  }
  static const char* last_error(void* ctx) { return static_cast<DirStore*>(ctx)->error_.c_str(); }
  int error(std::string msg) {
    error_ = std::move(msg);
    return SP_ERR_INTERNAL;
  }

  std::string dir_;
  std::string error_;
  sp_store abi_{};
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

TEST(NcclMultiRank, Conformance) {
  const char* url = std::getenv("SHARDPLAN_STORE");
  const int size = env_int("WORLD_SIZE", 0), rank = env_int("RANK", -1);
  if (!url || size < 1 || rank < 0) GTEST_SKIP() << "not started by `shardplan launch -n N` (no RANK/WORLD_SIZE)";
  const std::string prefix = "file://";
  const std::string store_url(url);
  if (store_url.compare(0, prefix.size(), prefix) != 0)
    GTEST_SKIP() << "needs the single-node launcher's file store, got SHARDPLAN_STORE=" << store_url;
  const int local_rank = env_int("LOCAL_RANK", rank);
  SKIP_UNLESS_DEVICES(env_int("LOCAL_WORLD_SIZE", size));

  DirStore store(std::filesystem::path(store_url.substr(prefix.size())).parent_path().string() + "/nccl_tests");
  DeviceMemory mem(local_rank, nullptr);
  sp_comm* comm = create(store.abi(), rank, size, {"local_rank=" + std::to_string(local_rank)});
  ASSERT_NE(comm, nullptr);
  conf::Options o = nccl_options();
  o.memory = mem.memory;
  expect_conformance(comm, o);
  plugin()->destroy(comm);

  // The store path of split, as NCCL < 2.18 takes it.
  comm = create(store.abi(), rank, size, {"local_rank=" + std::to_string(local_rank), "split=store"});
  ASSERT_NE(comm, nullptr);
  o.counts = {0, 7, 1023};
  expect_conformance(comm, o);
  plugin()->destroy(comm);
}

}  // namespace
