#include "plugin_rank.h"

#include <stdexcept>

#include "cuda.h"
#include "shardplan/comm_dtype.h"

namespace shardplan_bench {

namespace {

class PluginRank final : public Rank {
 public:
  explicit PluginRank(const PluginRankConfig& cfg) : cfg_(cfg), api_(cfg.api) {
    if (cfg_.cuda_device >= 0) {
      cuda_ = Cuda::get();
      if (!cuda_) throw std::runtime_error("no CUDA runtime library (libcudart.so) could be loaded");
      cuda_->set_device(cfg_.cuda_device);
      stream_ = cuda_->create_stream();
    }
    std::vector<const char*> opts;
    for (const std::string& s : cfg_.options) opts.push_back(s.c_str());
    opts.push_back(nullptr);
    sp_comm_config c{};
    c.struct_size = sizeof c;
    c.rank = cfg_.rank;
    c.world_size = cfg_.size;
    c.timeout_ms = cfg_.timeout_ms;
    c.store = cfg_.store;
    c.options = opts.data();
    if (api_->create(&c, &comm_) != SP_OK)
      throw std::runtime_error(std::string(api_->name) + " create (rank " + std::to_string(cfg_.rank) + " of " +
                               std::to_string(cfg_.size) + "): " + api_->last_error());
  }
  ~PluginRank() override {
    if (comm_) api_->destroy(comm_);
    if (cuda_) cuda_->destroy_stream(stream_);
  }

  int rank() const override { return cfg_.rank; }
  int size() const override { return cfg_.size; }
  std::string last_error() const override { return error_; }
  void abort() { api_->abort(comm_); }

  bool on_host() const override { return cuda_ == nullptr; }
  void* alloc(size_t bytes) override { return cuda_ ? cuda_->malloc(bytes) : Rank::alloc(bytes); }
  void release(void* p) override {
    if (cuda_) cuda_->free(p);
    else Rank::release(p);
  }
  void upload(void* dst, const void* host, size_t bytes) override {
    if (cuda_) cuda_->to_device(dst, host, bytes);
    else Rank::upload(dst, host, bytes);
  }
  void download(void* host, const void* src, size_t bytes) override {
    if (cuda_) cuda_->to_host(host, src, bytes);
    else Rank::download(host, src, bytes);
  }

  int run(const Call& c) override {
    const sp_buffer s = buffer(c.send, c.send_count), r = buffer(c.recv, c.recv_count);
    int st = SP_ERR_UNSUPPORTED;
    switch (c.coll) {
      case Collective::AllReduce:
        if (api_->all_reduce) st = api_->all_reduce(comm_, &s, &r, SP_SUM, nullptr);
        break;
      case Collective::AllGather:
        if (api_->all_gather) st = api_->all_gather(comm_, &s, &r, nullptr);
        break;
      case Collective::ReduceScatter:
        if (api_->reduce_scatter) st = api_->reduce_scatter(comm_, &s, &r, SP_SUM, nullptr);
        break;
      case Collective::Broadcast:
        if (api_->broadcast) st = api_->broadcast(comm_, &s, &r, 0, nullptr);
        break;
      case Collective::AllToAll:
        if (api_->all_to_all) st = api_->all_to_all(comm_, &s, &r, nullptr);
        break;
      case Collective::SendRecv:
        if (api_->send && api_->recv && api_->wait) st = ring_exchange(s, r);
        break;
    }
    if (st == SP_OK && cuda_) cuda_->synchronize(stream_);
    if (st == SP_OK) return SP_OK;
    error_ = api_->last_error() ? api_->last_error() : "";
    if (st == SP_ERR_UNSUPPORTED) {
      if (error_.empty()) error_ = std::string(api_->name) + " has no " + collective_name(c.coll);
      return st;
    }
    throw std::runtime_error(error_);
  }

 private:
  sp_buffer buffer(void* p, uint64_t n) const {
    sp_buffer b{};
    b.data = p;
    b.count = n;
    b.dtype = cfg_.dtype;
    b.device_type = cuda_ ? SP_DEVICE_CUDA : SP_DEVICE_CPU;
    b.device_index = cuda_ ? cfg_.cuda_device : 0;
    b.stream = stream_;
    return b;
  }

  // Receive posted first: a backend whose sends wait for the matching
  // receive cannot deadlock the ring either way, since both are async.
  int ring_exchange(const sp_buffer& s, const sp_buffer& r) {
    const int n = cfg_.size, me = cfg_.rank;
    sp_work *wr = nullptr, *ws = nullptr;
    int st = api_->recv(comm_, &r, (me + n - 1) % n, 0, &wr);
    if (st != SP_OK) return st;
    st = api_->send(comm_, &s, (me + 1) % n, 0, &ws);
    if (st != SP_OK) {
      api_->release(wr);  // our peer will time out; waiting here would only add our own timeout
      return st;
    }
    const int st_send = api_->wait(ws, -1);
    api_->release(ws);
    const int st_recv = api_->wait(wr, -1);
    api_->release(wr);
    return st_send != SP_OK ? st_send : st_recv;
  }

  PluginRankConfig cfg_;
  const sp_comm_api* api_;
  sp_comm* comm_ = nullptr;
  const Cuda* cuda_ = nullptr;
  void* stream_ = nullptr;
  std::string error_;
};

}  // namespace

std::unique_ptr<Rank> make_plugin_rank(const PluginRankConfig& config) { return std::make_unique<PluginRank>(config); }

void abort_plugin_rank(Rank& rank) {
  if (auto* p = dynamic_cast<PluginRank*>(&rank)) p->abort();
}

}  // namespace shardplan_bench
