#include "sweep.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <stdexcept>
#include <vector>

#include "pattern.h"
#include "protocol.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_dtype.h"
#include "stats.h"

namespace shardplan_bench {

namespace {

using Clock = std::chrono::steady_clock;

// For tests of failure handling, SHARDPLAN_BENCH_FAULT=<rank>[:hang] makes
// that rank die (exit status 3, no message), or stop responding, when it
// reaches its second size; SHARDPLAN_BENCH_CORRUPT=<rank> makes that rank
// spoil one element of every result it checks.
bool env_names(const char* var, int rank, std::string* rest = nullptr) {
  const char* env = std::getenv(var);
  if (!env || !*env) return false;
  char* end = nullptr;
  const long named = std::strtol(env, &end, 10);
  const std::string tail = *end == ':' ? end + 1 : end;
  // A typo ("1:hnag") must not turn the test's hang into a plain death.
  if (end == env || named < 0 || (*end && (!rest || *end != ':' || tail != "hang")))
    throw std::runtime_error(std::string(var) + "='" + env + "' is not a rank" + (rest ? " or RANK:hang" : ""));
  if (named != rank) return false;
  if (rest) *rest = tail;
  return true;
}

void inject_fault(int rank) {
  std::string how;
  if (!env_names("SHARDPLAN_BENCH_FAULT", rank, &how)) return;
  if (how == "hang")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  std::_Exit(3);
}

class Sweeper {
 public:
  Sweeper(Rank& rank, const SweepOptions& o)
      : r_(rank), o_(o), me_(rank.rank()), n_(rank.size()),
        es_(shardplan::comm::dtype_size(o.dtype)) {}

  void run() {
    int sizes_done = 0;
    for (Collective c : o_.collectives) {
      if (!r_.supports(c)) continue;
      std::vector<Geometry> geoms;
      std::vector<uint64_t> bytes;
      for (uint64_t b : o_.sizes()) {
        Geometry g = geometry(c, b, es_, n_);
        if (g.empty()) continue;
        geoms.push_back(g);
        bytes.push_back(g.total * es_);
      }
      if (geoms.empty()) continue;
      uint64_t elems = 0;
      for (const Geometry& g : geoms) elems = std::max({elems, g.send, g.recv});
      Buffers buf(r_, elems * es_, o_.check && !r_.on_host());

      coll_ = c;
      supported_[0] = true;
      supported_[1] = c != Collective::SendRecv;  // one buffer cannot be sent and received in place
      for (int w = 0; w < o_.warmup && supported_[0]; ++w) call(make(geoms.back(), buf, false), 0, bytes.back());

      for (size_t k = 0; k < geoms.size(); ++k) {
        if (me_ == 0) emit(encode_at(c, bytes[k]));
        if (++sizes_done == 2) inject_fault(me_);
        RankRow row;
        row.rank = me_;
        row.coll = c;
        row.bytes = bytes[k];
        row.count = geoms[k].count;
        row.out = measure(geoms[k], buf, false, bytes[k]);
        row.in = measure(geoms[k], buf, true, bytes[k]);
        emit(encode_row(row));
      }
    }
  }

 private:
  // Device buffers are checked through host copies.
  struct Buffers {
    Buffers(Rank& r, size_t bytes, bool staging) : r(r), bytes(bytes) {
      send = r.alloc(bytes);
      recv = r.alloc(bytes);
      if (staging) {
        host_send.resize(bytes + 64);
        host_recv.resize(bytes + 64);
      }
    }
    ~Buffers() {
      r.release(send);
      r.release(recv);
    }
    void* hsend() { return host_send.empty() ? send : host_send.data(); }
    void* hrecv() { return host_recv.empty() ? recv : host_recv.data(); }
    Rank& r;
    size_t bytes;
    void *send, *recv;
    std::vector<unsigned char> host_send, host_recv;
  };

  static void* at(void* p, uint64_t elements, size_t es) { return static_cast<unsigned char*>(p) + elements * es; }

  Call make(const Geometry& g, Buffers& b, bool in_place) const {
    Call c;
    c.coll = coll_;
    c.in_place = in_place;
    c.send_count = g.send;
    c.recv_count = g.recv;
    c.send = b.send;
    c.recv = b.recv;
    if (in_place) {
      c.send = c.recv = b.recv;
      if (coll_ == Collective::AllGather) c.send = at(b.recv, me_ * g.block, es_);
      if (coll_ == Collective::ReduceScatter) c.recv = at(b.recv, me_ * g.block, es_);
    }
    return c;
  }

  // False when the backend said the call is unsupported.
  bool call(const Call& c, int mode, uint64_t bytes) {
    int st;
    try {
      st = r_.run(c);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string(collective_name(coll_)) + " " + (mode ? "in-place" : "out-of-place") +
                               " at " + human_bytes(bytes) + ": " + e.what());
    }
    if (st == SP_OK) return true;
    supported_[mode] = false;
    if (me_ == 0)
      emit(encode_note(std::string(collective_name(coll_)) + (mode ? " in-place" : " out-of-place") +
                       " not measured: unsupported (" + r_.last_error() + ")"));
    return false;
  }

  ModeResult measure(const Geometry& g, Buffers& b, bool in_place, uint64_t bytes) {
    ModeResult m;
    const int mode = in_place ? 1 : 0;
    if (!supported_[mode]) return m;
    const Call c = make(g, b, in_place);
    const bool check = o_.check && r_.checkable();
    if (check) prepare(g, b, c);
    if (!call(c, mode, bytes)) return m;
    if (check) m.wrong = static_cast<int64_t>(verify(g, b, c, env_names("SHARDPLAN_BENCH_CORRUPT", me_)));
    std::vector<double> t(static_cast<size_t>(o_.iters));
    for (double& s : t) {
      const auto t0 = Clock::now();
      if (!call(c, mode, bytes)) return ModeResult{};
      s = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    m.measured = true;
    m.mean_s = mean_of(t);
    m.p50_s = percentile(t, 0.5);
    m.p99_s = percentile(t, 0.99);
    return m;
  }

  // Zeroes the output, then writes this rank's input (see pattern.h).
  void prepare(const Geometry& g, Buffers& b, const Call& c) {
    const int32_t dt = o_.dtype;
    void* hs = b.hsend();
    void* hr = b.hrecv();
    const uint64_t sbase = c.in_place ? elements_between(b.recv, c.send) : 0;
    void* hin = c.in_place ? at(hr, sbase, es_) : hs;
    std::memset(hr, 0, b.bytes);
    switch (coll_) {
      case Collective::AllReduce:
      case Collective::ReduceScatter:
        fill(dt, hin, g.send, [&](uint64_t i) { return reduce_input(me_, i); });
        break;
      case Collective::AllGather:
      case Collective::AllToAll:
      case Collective::SendRecv:
        fill(dt, hin, g.send, [&](uint64_t i) { return copy_value(me_, i); });
        break;
      case Collective::Broadcast:
        // Only the root's data may arrive; others hold data of their own
        // out of place (in place, their buffer is the output, so zeros).
        if (me_ == 0 || !c.in_place) fill(dt, hin, g.send, [&](uint64_t i) { return copy_value(me_, i); });
        break;
    }
    if (!r_.on_host()) {
      r_.upload(b.recv, hr, b.bytes);
      if (!c.in_place) r_.upload(b.send, hs, g.send * es_);
    }
  }

  uint64_t verify(const Geometry& g, Buffers& b, const Call& c, bool corrupt) {
    const int32_t dt = o_.dtype;
    void* hr = b.hrecv();
    if (!r_.on_host()) r_.download(hr, b.recv, b.bytes);
    void* out = at(hr, elements_between(b.recv, c.recv), es_);
    if (corrupt) std::memset(out, 0, es_);  // 0 is never an expected value
    const int n = n_, me = me_;
    const uint64_t block = g.block;
    switch (coll_) {
      case Collective::AllReduce: {
        ReduceSum sum(n);
        return count_wrong(dt, out, g.recv, sum);
      }
      case Collective::ReduceScatter: {
        ReduceSum sum(n);
        return count_wrong(dt, out, g.recv, [&](uint64_t i) { return sum(me * block + i); });
      }
      case Collective::AllGather:
        return count_wrong(dt, out, g.recv, [&](uint64_t i) { return copy_value(int(i / block), i % block); });
      case Collective::AllToAll:
        return count_wrong(dt, out, g.recv,
                           [&](uint64_t i) { return copy_value(int(i / block), me * block + i % block); });
      case Collective::Broadcast:
        return count_wrong(dt, out, g.recv, [&](uint64_t i) { return copy_value(0, i); });
      case Collective::SendRecv:
        return count_wrong(dt, out, g.recv, [&](uint64_t i) { return copy_value((me + n - 1) % n, i); });
    }
    return 0;
  }

  uint64_t elements_between(const void* base, const void* p) const {
    return static_cast<uint64_t>(static_cast<const unsigned char*>(p) - static_cast<const unsigned char*>(base)) / es_;
  }

  Rank& r_;
  const SweepOptions& o_;
  const int me_, n_;
  const size_t es_;
  Collective coll_ = Collective::AllReduce;
  bool supported_[2] = {true, true};
};

}  // namespace

void run_sweep(Rank& rank, const SweepOptions& options) {
  Sweeper(rank, options).run();
  rank.finish();
  emit(encode_done(rank.rank()));
}

}  // namespace shardplan_bench
