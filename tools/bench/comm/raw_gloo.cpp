#include "raw_gloo.h"

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include <filesystem>

#include "shardplan/abi/comm.h"

namespace shardplan_bench {

namespace {

template <class T>
void reduce_with(gloo::AllreduceOptions& o, const void* send, void* recv, uint64_t n) {
  if (send != recv) o.setInput(static_cast<T*>(const_cast<void*>(send)), n);
  o.setOutput(static_cast<T*>(recv), n);
  o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
}

}  // namespace

RawGloo::RawGloo(int rank, int size, const std::string& dir, const std::string& name,
                 std::chrono::milliseconds timeout)
    : timeout_(timeout) {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  device_ = gloo::transport::tcp::CreateDevice(attr);
  std::filesystem::create_directories(dir + "/" + name);
  gloo::rendezvous::FileStore files(dir + "/" + name);
  gloo::rendezvous::PrefixStore store(name, files);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(timeout);
  ctx->connectFullMesh(store, device_);
  ctx_ = ctx;
}

RawGloo::~RawGloo() = default;

bool RawGloo::supports(int32_t dtype) { return dtype != SP_BFLOAT16 && dtype >= SP_FLOAT32 && dtype <= SP_INT64; }

void RawGloo::all_reduce(const void* send, void* recv, uint64_t n, int32_t dtype) {
  gloo::AllreduceOptions o(ctx_);
  switch (dtype) {
    case SP_FLOAT32: reduce_with<float>(o, send, recv, n); break;
    case SP_FLOAT64: reduce_with<double>(o, send, recv, n); break;
    case SP_FLOAT16: reduce_with<gloo::float16>(o, send, recv, n); break;
    case SP_INT8: reduce_with<int8_t>(o, send, recv, n); break;
    case SP_UINT8: reduce_with<uint8_t>(o, send, recv, n); break;
    case SP_INT32: reduce_with<int32_t>(o, send, recv, n); break;
    case SP_INT64: reduce_with<int64_t>(o, send, recv, n); break;
    default: throw std::runtime_error("raw gloo has no sum for this dtype");
  }
  o.setTag(tag_++);
  o.setTimeout(timeout_);
  gloo::allreduce(o);
}

void RawGloo::barrier() {
  gloo::BarrierOptions o(ctx_);
  o.setTag(tag_++);
  o.setTimeout(timeout_);
  gloo::barrier(o);
}

namespace {

class RawGlooRank final : public Rank {
 public:
  RawGlooRank(int rank, int size, const std::string& dir, int32_t dt, std::chrono::milliseconds timeout)
      : rank_(rank), size_(size), dt_(dt), gloo_(rank, size, dir, "raw", timeout) {}
  // gloo closes its sockets at once on destruction: a peer still reading
  // from them would see "connection closed", so everyone leaves together.
  void finish() override { gloo_.barrier(); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool supports(Collective c) const override { return c == Collective::AllReduce; }
  std::string last_error() const override { return "gloo has no sum for bfloat16"; }
  int run(const Call& c) override {
    if (!RawGloo::supports(dt_)) return SP_ERR_UNSUPPORTED;
    gloo_.all_reduce(c.send, c.recv, c.recv_count, dt_);
    return 0;
  }

 private:
  const int rank_, size_;
  const int32_t dt_;
  RawGloo gloo_;
};

}  // namespace

std::unique_ptr<Rank> make_raw_gloo_rank(int rank, int size, const std::string& dir, int32_t dtype,
                                         std::chrono::milliseconds timeout) {
  return std::make_unique<RawGlooRank>(rank, size, dir, dtype, timeout);
}

}  // namespace shardplan_bench
