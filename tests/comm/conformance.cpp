#include "conformance.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <thread>

#include "shardplan/comm_dtype.h"

namespace shardplan {
namespace conformance {
namespace {

using comm::dtype_name;
using comm::dtype_size;
using comm::reduce_op_name;

constexpr unsigned char kSentinel = 0xA5;
constexpr size_t kGuardBytes = 64;

void put(int32_t dt, void* p, uint64_t i, int64_t v) {
  switch (dt) {
    case SP_FLOAT32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case SP_FLOAT64: static_cast<double*>(p)[i] = static_cast<double>(v); break;
    case SP_FLOAT16: static_cast<uint16_t*>(p)[i] = comm::float_to_f16(static_cast<float>(v)); break;
    case SP_BFLOAT16: static_cast<uint16_t*>(p)[i] = comm::float_to_bf16(static_cast<float>(v)); break;
    case SP_INT8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case SP_UINT8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case SP_INT32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case SP_INT64: static_cast<int64_t*>(p)[i] = v; break;
  }
}

// The element as a double (exact for every value this suite produces).
double get(int32_t dt, const void* p, uint64_t i) {
  switch (dt) {
    case SP_FLOAT32: return static_cast<const float*>(p)[i];
    case SP_FLOAT64: return static_cast<const double*>(p)[i];
    case SP_FLOAT16: return comm::f16_to_float(static_cast<const uint16_t*>(p)[i]);
    case SP_BFLOAT16: return comm::bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case SP_INT8: return static_cast<const int8_t*>(p)[i];
    case SP_UINT8: return static_cast<const uint8_t*>(p)[i];
    case SP_INT32: return static_cast<const int32_t*>(p)[i];
    case SP_INT64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return NAN;
}

// Inputs: in [-4, 4] (uint8: [0, 8]) for sum/max/min, so a sum over up to 31
// ranks stays exact in every dtype; {1, -1, 2} for products, with the 2s
// limited to ranks < 6 so a product is at most 64 in magnitude.
int64_t value(int32_t dt, int32_t op, int rank, uint64_t i, uint64_t salt) {
  if (op == SP_PROD) {
    int h = static_cast<int>((static_cast<uint64_t>(rank) * 3 + i * 5 + salt) % 3);
    if (h == 2 && rank >= 6) h = 0;
    static const int64_t sgn[3] = {1, -1, 2}, uns[3] = {1, 1, 2};
    return dt == SP_UINT8 ? uns[h] : sgn[h];
  }
  int64_t v = static_cast<int64_t>((static_cast<uint64_t>(rank) * 7 + i * 13 + salt * 5) % 9);
  return dt == SP_UINT8 ? v : v - 4;
}

int64_t reduce_ref(int32_t dt, int32_t op, int n, uint64_t i, uint64_t salt) {
  int64_t acc = value(dt, op, 0, i, salt);
  for (int k = 1; k < n; ++k) {
    const int64_t v = value(dt, op, k, i, salt);
    switch (op) {
      case SP_SUM: acc += v; break;
      case SP_PROD: acc *= v; break;
      case SP_MAX: acc = std::max(acc, v); break;
      case SP_MIN: acc = std::min(acc, v); break;
    }
  }
  return acc;
}

// The running rank's Options::memory, set by run_conformance for its thread
// so that every Buf finds it without being told.
thread_local const Memory* t_memory = nullptr;

// Heap memory with a guard zone after the last element, pre-filled with a
// sentinel that is never a valid result. With device memory (Options::memory)
// mem_ is the host copy: desc() uploads it when it was written, and reading
// it downloads first when a desc() was handed out since.
class Buf {
 public:
  Buf(int32_t dt, uint64_t count)
      : dt_(dt), count_(count), mem_(count * dtype_size(dt) + kGuardBytes, kSentinel), memory_(t_memory) {
    if (memory_ && memory_->alloc) dev_ = static_cast<char*>(memory_->alloc(mem_.size()));
  }
  ~Buf() {
    if (dev_) memory_->free(dev_);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  int32_t dtype() const { return dt_; }
  uint64_t count() const { return count_; }
  char* data() {
    sync();
    host_written_ = true;
    return mem_.data();
  }
  char* at(uint64_t elem) { return data() + elem * dtype_size(dt_); }
  // The host copy of what `b` (a desc of this buffer) points at.
  const char* host(const sp_buffer& b) {
    sync();
    return mem_.data() + (static_cast<const char*>(b.data) - (dev_ ? dev_ : mem_.data()));
  }
  sp_buffer desc() { return desc_at(0, count_); }
  sp_buffer desc_at(uint64_t elem, uint64_t count) {
    sp_buffer b{};
    b.data = (dev_ ? dev_ : mem_.data()) + elem * dtype_size(dt_);
    b.count = count;
    b.dtype = dt_;
    b.device_type = SP_DEVICE_CPU;
    b.device_index = 0;
    b.stream = nullptr;
    if (dev_) {
      if (host_written_) memory_->upload(dev_, mem_.data(), mem_.size());
      host_written_ = false;
      device_written_ = true;
      b.device_type = memory_->device_type;
      b.device_index = memory_->device_index;
      b.stream = memory_->stream;
    }
    return b;
  }
  void fill(uint64_t from, uint64_t n, const std::function<int64_t(uint64_t)>& f) {
    for (uint64_t i = 0; i < n; ++i) put(dt_, data(), from + i, f(i));
  }
  bool guard_ok() {
    sync();
    for (size_t b = count_ * dtype_size(dt_); b < mem_.size(); ++b)
      if (static_cast<unsigned char>(mem_[b]) != kSentinel) return false;
    return true;
  }
  std::vector<char> snapshot() {
    sync();
    return mem_;
  }
  bool same_as(const std::vector<char>& snap) {
    sync();
    return snap == mem_;
  }

 private:
  void sync() {
    if (dev_ && device_written_) memory_->download(mem_.data(), dev_, mem_.size());
    device_written_ = false;
  }

  int32_t dt_;
  uint64_t count_;
  std::vector<char> mem_;
  const Memory* memory_;
  char* dev_ = nullptr;
  bool host_written_ = true;
  bool device_written_ = false;
};

class Suite {
 public:
  Suite(const sp_comm_api* api, sp_comm* comm, const Options& o)
      : api_(api), comm_(comm), o_(o), rank_(api->rank(comm)), n_(api->size(comm)) {}

  Result run() {
    run_all_reduce();
    run_reduce_scatter();
    run_all_gather();
    run_broadcast();
    run_scatter();
    run_gather();
    run_all_to_all();
    run_barrier();
    if (o_.p2p) run_p2p();
    if (o_.async) run_async();
    if (o_.split) run_split();
    return std::move(result_);
  }

 private:
  enum Mode { OUT, IN, BLOCK };
  static const char* mode_name(Mode m) { return m == OUT ? "out-of-place" : m == IN ? "in-place" : "block-in-place"; }
  std::vector<Mode> modes(bool block) const {
    std::vector<Mode> m{OUT, IN};
    if (block && o_.block_in_place) m.push_back(BLOCK);
    return m;
  }

  void pass() { ++result_.passed; }
  void fail(const std::string& check, const std::string& why) {
    ++result_.failed;
    if (result_.failures.size() < o_.max_messages)
      result_.failures.push_back("rank " + std::to_string(rank_) + ": " + check + ": " + why);
  }
  void record(const std::string& check, const std::string& why) {
    if (why.empty())
      pass();
    else
      fail(check, why);
  }

  std::string status_error(int st) const {
    const char* e = api_->last_error();
    return "returned status " + std::to_string(st) + " (" + (e ? e : "") + ")";
  }

  // First element of `p` that differs from expect(i), i in [0, n), or "".
  static std::string compare(int32_t dt, const void* p, uint64_t n, const std::function<int64_t(uint64_t)>& expect,
                             const char* where = "element") {
    for (uint64_t i = 0; i < n; ++i) {
      const double got = get(dt, p, i);
      const int64_t want = expect(i);
      if (got != static_cast<double>(want))
        return std::string(where) + " " + std::to_string(i) + " is " + std::to_string(got) + ", expected " +
               std::to_string(want);
    }
    return {};
  }

  // Runs a blocking call or, when `async`, issues it with a work handle and waits.
  int call(bool async, const std::function<int(sp_work**)>& f) {
    if (!async) return f(nullptr);
    sp_work* w = nullptr;
    int st = f(&w);
    if (st != SP_OK) return st;
    st = api_->wait(w, o_.wait_timeout_ms);
    api_->release(w);
    return st;
  }

  std::string name(const char* coll, int32_t dt, uint64_t c, const char* extra = nullptr, Mode m = OUT,
                   bool async = false) const {
    std::string s = std::string(async ? "async " : "") + coll + " " + dtype_name(dt);
    if (extra) s += std::string(" ") + extra;
    return s + " count=" + std::to_string(c) + " " + mode_name(m);
  }

  // ------------------------------------------------------------ collectives

  void all_reduce_case(int32_t dt, uint64_t c, Mode m, int32_t op, bool async) {
    const uint64_t salt = ++salt_;
    const std::string what = name("all_reduce", dt, c, reduce_op_name(op), m, async);
    Buf send(dt, c), recv(dt, c);
    send.fill(0, c, [&](uint64_t i) { return value(dt, op, rank_, i, salt); });
    auto before = send.snapshot();
    sp_buffer sb = send.desc(), rb = m == IN ? sb : recv.desc();
    int st = call(async, [&](sp_work** w) { return api_->all_reduce(comm_, &sb, &rb, op, w); });
    if (st != SP_OK) return fail(what, status_error(st));
    Buf& out = m == IN ? send : recv;
    std::string why = compare(dt, out.data(), c, [&](uint64_t i) { return reduce_ref(dt, op, n_, i, salt); });
    if (why.empty() && !out.guard_ok()) why = "wrote past the end of recv";
    if (why.empty() && m == OUT && !send.same_as(before)) why = "modified the send buffer";
    record(what, why);
  }

  // Replicas must not drift apart: whatever order a backend sums in, every
  // rank has to end with the same bits. Inputs with fractions make the order
  // visible (integers would sum exactly in any order); all_gather then lays
  // every rank's result side by side.
  void all_reduce_same_bits_case(int32_t dt, uint64_t c, bool in_place) {
    const std::string what = name("all_reduce", dt, c, "sum of fractions: same bits on every rank", in_place ? IN : OUT);
    Buf send(dt, c), recv(dt, c);
    char* p = send.data();
    for (uint64_t i = 0; i < c; ++i) {
      const double v = 1.0 / (3.0 + static_cast<double>(rank_)) + 1e-3 * static_cast<double>(i % 977) / 7.0;
      if (dt == SP_FLOAT32) reinterpret_cast<float*>(p)[i] = static_cast<float>(v);
      else reinterpret_cast<double*>(p)[i] = v;
    }
    sp_buffer sb = send.desc(), rb = in_place ? sb : recv.desc();
    int st = api_->all_reduce(comm_, &sb, &rb, SP_SUM, nullptr);
    if (st != SP_OK) return fail(what, status_error(st));
    Buf& out = in_place ? send : recv;
    Buf all(dt, c * static_cast<uint64_t>(n_));
    sp_buffer ob = out.desc(), ab = all.desc();
    st = api_->all_gather(comm_, &ob, &ab, nullptr);
    if (st != SP_OK) return fail(what, "all_gather of the results " + status_error(st));
    const size_t bytes = c * dtype_size(dt);
    const char* mine = out.data();
    const char* everyone = all.data();
    std::string why;
    for (int r = 0; r < n_ && why.empty(); ++r)
      if (std::memcmp(everyone + bytes * r, mine, bytes) != 0)
        why = "rank " + std::to_string(r) + "'s result differs from this rank's";
    record(what, why);
  }

  void run_all_reduce() {
    for (int32_t dt : {SP_FLOAT32, SP_FLOAT64})
      if (std::count(o_.dtypes.begin(), o_.dtypes.end(), dt))
        for (uint64_t c : o_.counts)
          if (c > 0)
            for (bool in_place : {false, true}) all_reduce_same_bits_case(dt, c, in_place);
    for (int32_t dt : o_.dtypes)
      for (uint64_t c : o_.counts)
        for (Mode m : modes(false))
          for (int32_t op : {SP_SUM, SP_MAX, SP_MIN, SP_PROD}) all_reduce_case(dt, c, m, op, false);
  }

  void reduce_scatter_case(int32_t dt, uint64_t c, Mode m, int32_t op, bool async) {
    const uint64_t salt = ++salt_;
    const std::string what = name("reduce_scatter", dt, c, reduce_op_name(op), m, async);
    Buf send(dt, c * n_), recv(dt, c);
    send.fill(0, c * n_, [&](uint64_t i) { return value(dt, op, rank_, i, salt); });
    auto before = send.snapshot();
    sp_buffer sb = send.desc();
    sp_buffer rb = m == OUT ? recv.desc() : m == IN ? send.desc_at(0, c) : send.desc_at(rank_ * c, c);
    int st = call(async, [&](sp_work** w) { return api_->reduce_scatter(comm_, &sb, &rb, op, w); });
    if (st != SP_OK) return fail(what, status_error(st));
    const char* out = (m == OUT ? recv : send).host(rb);
    std::string why =
        compare(dt, out, c, [&](uint64_t i) { return reduce_ref(dt, op, n_, rank_ * c + i, salt); });
    if (why.empty() && !(m == OUT ? recv : send).guard_ok()) why = "wrote past the end of the buffer";
    if (why.empty() && m == OUT && !send.same_as(before)) why = "modified the send buffer";
    record(what, why);
  }

  void run_reduce_scatter() {
    for (int32_t dt : o_.dtypes)
      for (uint64_t c : o_.counts)
        for (Mode m : modes(true))
          for (int32_t op : {SP_SUM, SP_MAX, SP_MIN, SP_PROD}) reduce_scatter_case(dt, c, m, op, false);
  }

  void all_gather_case(int32_t dt, uint64_t c, Mode m, bool async) {
    const uint64_t salt = ++salt_;
    const std::string what = name("all_gather", dt, c, nullptr, m, async);
    Buf send(dt, c), recv(dt, c * n_);
    auto mine = [&](uint64_t i) { return value(dt, SP_SUM, rank_, i, salt); };
    sp_buffer sb;
    if (m == OUT) {
      send.fill(0, c, mine);
      sb = send.desc();
    } else {
      const uint64_t at = m == IN ? 0 : rank_ * c;
      recv.fill(at, c, mine);
      sb = recv.desc_at(at, c);
    }
    auto before = send.snapshot();
    sp_buffer rb = recv.desc();
    int st = call(async, [&](sp_work** w) { return api_->all_gather(comm_, &sb, &rb, w); });
    if (st != SP_OK) return fail(what, status_error(st));
    std::string why;
    for (int j = 0; j < n_ && why.empty(); ++j)
      why = compare(dt, recv.at(j * c), c, [&](uint64_t i) { return value(dt, SP_SUM, j, i, salt); },
                    ("block " + std::to_string(j) + " element").c_str());
    if (why.empty() && !recv.guard_ok()) why = "wrote past the end of recv";
    if (why.empty() && m == OUT && !send.same_as(before)) why = "modified the send buffer";
    record(what, why);
  }

  void run_all_gather() {
    for (int32_t dt : o_.dtypes)
      for (uint64_t c : o_.counts)
        for (Mode m : modes(true)) all_gather_case(dt, c, m, false);
  }

  void broadcast_case(int32_t dt, uint64_t c, Mode m, int root, bool async) {
    const uint64_t salt = ++salt_;
    const std::string extra = "root=" + std::to_string(root);
    const std::string what = name("broadcast", dt, c, extra.c_str(), m, async);
    Buf send(dt, c), recv(dt, c);
    auto input = [&](uint64_t i) { return value(dt, SP_SUM, root, i, salt); };
    sp_buffer sb, rb = recv.desc();
    if (m == IN) {
      if (rank_ == root) recv.fill(0, c, input);
      sb = rb;
    } else {
      if (rank_ == root) send.fill(0, c, input);  // elsewhere a dummy the backend must not need
      sb = send.desc();
    }
    auto before = send.snapshot();
    int st = call(async, [&](sp_work** w) { return api_->broadcast(comm_, &sb, &rb, root, w); });
    if (st != SP_OK) return fail(what, status_error(st));
    std::string why = compare(dt, recv.data(), c, input);
    if (why.empty() && !recv.guard_ok()) why = "wrote past the end of recv";
    if (why.empty() && m == OUT && !send.same_as(before)) why = "modified the send buffer";
    record(what, why);
  }

  void run_broadcast() {
    for (int32_t dt : o_.dtypes)
      for (uint64_t c : o_.counts)
        for (Mode m : modes(false))
          for (int root = 0; root < n_; ++root) broadcast_case(dt, c, m, root, false);
  }

  void scatter_case(int32_t dt, uint64_t c, Mode m, int root, bool async) {
    const uint64_t salt = ++salt_;
    const std::string extra = "root=" + std::to_string(root);
    const std::string what = name("scatter", dt, c, extra.c_str(), m, async);
    Buf send(dt, rank_ == root ? c * n_ : 0), recv(dt, c);
    sp_buffer sb, rb;
    if (rank_ == root) {
      for (int j = 0; j < n_; ++j) send.fill(j * c, c, [&](uint64_t i) { return value(dt, SP_SUM, j, i, salt); });
      sb = send.desc();
      rb = m == OUT ? recv.desc() : m == IN ? send.desc_at(0, c) : send.desc_at(root * c, c);
    } else {
      rb = recv.desc();
      sb = rb;
      sb.count = c * n_;  // a dummy of the right dtype, never read
    }
    auto before = send.snapshot();
    int st = call(async, [&](sp_work** w) { return api_->scatter(comm_, &sb, &rb, root, w); });
    if (st != SP_OK) return fail(what, status_error(st));
    std::string why =
        compare(dt, (rank_ == root && m != OUT ? send : recv).host(rb), c,
                [&](uint64_t i) { return value(dt, SP_SUM, rank_, i, salt); });
    if (why.empty() && !recv.guard_ok()) why = "wrote past the end of recv";
    if (why.empty() && !send.guard_ok()) why = "wrote past the end of send";
    if (why.empty() && rank_ == root && m == OUT && !send.same_as(before)) why = "modified the send buffer";
    record(what, why);
  }

  void run_scatter() {
    for (int32_t dt : o_.dtypes)
      for (uint64_t c : o_.counts)
        for (Mode m : modes(true))
          for (int root = 0; root < n_; ++root) scatter_case(dt, c, m, root, false);
  }

  void gather_case(int32_t dt, uint64_t c, Mode m, int root, bool async) {
    const uint64_t salt = ++salt_;
    const std::string extra = "root=" + std::to_string(root);
    const std::string what = name("gather", dt, c, extra.c_str(), m, async);
    Buf send(dt, c), recv(dt, rank_ == root ? c * n_ : 0);
    auto mine = [&](uint64_t i) { return value(dt, SP_SUM, rank_, i, salt); };
    sp_buffer sb, rb;
    if (rank_ == root) {
      rb = recv.desc();
      if (m == OUT) {
        send.fill(0, c, mine);
        sb = send.desc();
      } else {
        const uint64_t at = m == IN ? 0 : root * c;
        recv.fill(at, c, mine);
        sb = recv.desc_at(at, c);
      }
    } else {
      send.fill(0, c, mine);
      sb = send.desc();
      rb = sb;
      rb.count = c * n_;  // a dummy of the right dtype, never written
    }
    auto before = send.snapshot();
    int st = call(async, [&](sp_work** w) { return api_->gather(comm_, &sb, &rb, root, w); });
    if (st != SP_OK) return fail(what, status_error(st));
    std::string why;
    if (rank_ == root) {
      for (int j = 0; j < n_ && why.empty(); ++j)
        why = compare(dt, recv.at(j * c), c, [&](uint64_t i) { return value(dt, SP_SUM, j, i, salt); },
                      ("block " + std::to_string(j) + " element").c_str());
      if (why.empty() && !recv.guard_ok()) why = "wrote past the end of recv";
    }
    if (why.empty() && (m == OUT || rank_ != root) && !send.same_as(before)) why = "modified the send buffer";
    record(what, why);
  }

  void run_gather() {
    for (int32_t dt : o_.dtypes)
      for (uint64_t c : o_.counts)
        for (Mode m : modes(true))
          for (int root = 0; root < n_; ++root) gather_case(dt, c, m, root, false);
  }

  // `c` is the block size: rank r's block j goes to rank j.
  void all_to_all_case(int32_t dt, uint64_t c, Mode m, bool async) {
    const uint64_t salt = ++salt_;
    const std::string what = name("all_to_all", dt, c, "block", m, async);
    const uint64_t total = c * n_;
    Buf send(dt, total), recv(dt, total);
    send.fill(0, total, [&](uint64_t i) { return value(dt, SP_SUM, rank_, i, salt); });
    auto before = send.snapshot();
    sp_buffer sb = send.desc(), rb = m == IN ? sb : recv.desc();
    int st = call(async, [&](sp_work** w) { return api_->all_to_all(comm_, &sb, &rb, w); });
    if (st != SP_OK) return fail(what, status_error(st));
    Buf& out = m == IN ? send : recv;
    std::string why;
    for (int j = 0; j < n_ && why.empty(); ++j)
      why = compare(dt, out.at(j * c), c, [&](uint64_t i) { return value(dt, SP_SUM, j, rank_ * c + i, salt); },
                    ("block " + std::to_string(j) + " element").c_str());
    if (why.empty() && !out.guard_ok()) why = "wrote past the end of recv";
    if (why.empty() && m == OUT && !send.same_as(before)) why = "modified the send buffer";
    record(what, why);
  }

  void run_all_to_all() {
    for (int32_t dt : o_.dtypes)
      for (uint64_t c : o_.counts)
        for (Mode m : modes(false)) all_to_all_case(dt, c, m, false);
  }

  void run_barrier() {
    for (int i = 0; i < 3; ++i) {
      int st = api_->barrier(comm_, nullptr);
      record("barrier #" + std::to_string(i), st == SP_OK ? "" : status_error(st));
    }
  }

  // ------------------------------------------------------------ point to point

  void check_message(const std::string& what, Buf& buf, int src, int tag, uint64_t salt) {
    std::string why = compare(buf.dtype(), buf.data(), buf.count(),
                              [&](uint64_t i) { return value(buf.dtype(), SP_SUM, src * 31 + tag, i, salt); });
    if (why.empty() && !buf.guard_ok()) why = "wrote past the end of recv";
    record(what, why);
  }

  void run_p2p() {
    const int next = (rank_ + 1) % n_, prev = (rank_ + n_ - 1) % n_;
    for (int32_t dt : o_.dtypes) {
      for (uint64_t c : o_.counts) {
        // Blocking ring, ordered by parity so rendezvous sends cannot deadlock.
        if (n_ > 1) {
          const uint64_t salt = ++salt_;
          const int tag = 3;
          const std::string what = name("send/recv ring", dt, c);
          Buf out(dt, c), in(dt, c);
          out.fill(0, c, [&](uint64_t i) { return value(dt, SP_SUM, rank_ * 31 + tag, i, salt); });
          sp_buffer ob = out.desc(), ib = in.desc();
          int st1, st2;
          if (rank_ % 2 == 0) {
            st1 = api_->send(comm_, &ob, next, tag, nullptr);
            st2 = api_->recv(comm_, &ib, prev, tag, nullptr);
          } else {
            st2 = api_->recv(comm_, &ib, prev, tag, nullptr);
            st1 = api_->send(comm_, &ob, next, tag, nullptr);
          }
          if (st1 != SP_OK)
            fail(what + " send", status_error(st1));
          else if (st2 != SP_OK)
            fail(what + " recv", status_error(st2));
          else
            check_message(what, in, prev, tag, salt);
        }
        // Async ring (a self-loop with one rank): receive posted first.
        {
          const uint64_t salt = ++salt_;
          const int tag = 7;
          const std::string what = name("async send/recv ring", dt, c);
          Buf out(dt, c), in(dt, c);
          out.fill(0, c, [&](uint64_t i) { return value(dt, SP_SUM, rank_ * 31 + tag, i, salt); });
          sp_buffer ob = out.desc(), ib = in.desc();
          sp_work *rw = nullptr, *sw = nullptr;
          int st = api_->recv(comm_, &ib, prev, tag, &rw);
          if (st == SP_OK) st = api_->send(comm_, &ob, next, tag, &sw);
          int ws = sw ? api_->wait(sw, o_.wait_timeout_ms) : SP_OK;
          int wr = rw ? api_->wait(rw, o_.wait_timeout_ms) : SP_OK;
          if (sw) api_->release(sw);
          if (rw) api_->release(rw);
          if (st != SP_OK)
            fail(what, status_error(st));
          else if (ws != SP_OK)
            fail(what + " send", status_error(ws));
          else if (wr != SP_OK)
            fail(what + " recv", status_error(wr));
          else
            check_message(what, in, prev, tag, salt);
        }
      }
    }
    // Both ways at once, as a bidirectional ring step does (shardplan/ring.h):
    // to the right and from the left on one tag, to the left and from the
    // right on another, all four posted before any wait. With two ranks both
    // neighbours are one rank, told apart by the tags.
    if (n_ > 1) {
      const uint64_t salt = ++salt_;
      const int32_t dt = SP_FLOAT64;
      const uint64_t c = 1000;
      const int tag_r = 11, tag_l = 12;
      Buf out_r(dt, c), out_l(dt, c), in_l(dt, c), in_r(dt, c);
      out_r.fill(0, c, [&](uint64_t i) { return value(dt, SP_SUM, rank_ * 31 + tag_r, i, salt); });
      out_l.fill(0, c, [&](uint64_t i) { return value(dt, SP_SUM, rank_ * 31 + tag_l, i, salt); });
      sp_buffer a = out_r.desc(), b = out_l.desc(), from_left = in_l.desc(), from_right = in_r.desc();
      sp_work* w[4] = {nullptr, nullptr, nullptr, nullptr};
      int st = api_->recv(comm_, &from_left, prev, tag_r, &w[0]);
      if (st == SP_OK) st = api_->recv(comm_, &from_right, next, tag_l, &w[1]);
      if (st == SP_OK) st = api_->send(comm_, &a, next, tag_r, &w[2]);
      if (st == SP_OK) st = api_->send(comm_, &b, prev, tag_l, &w[3]);
      int ws = SP_OK;
      for (sp_work* x : w) {
        if (!x) continue;
        int s2 = api_->wait(x, o_.wait_timeout_ms);
        if (ws == SP_OK && s2 != SP_OK) ws = s2;
        api_->release(x);
      }
      const std::string what = "async send/recv both ways";
      if (st != SP_OK || ws != SP_OK) {
        fail(what, status_error(st != SP_OK ? st : ws));
      } else {
        check_message(what + " (from the left)", in_l, prev, tag_r, salt);
        check_message(what + " (from the right)", in_r, next, tag_l, salt);
      }
    }
    // Matching by (peer, tag), in order within a tag: sends go out as tags
    // 1, 2, 1 and are received as 2, 1, 1.
    if (o_.p2p_tag_matching) {
      const uint64_t salt = ++salt_;
      const int32_t dt = SP_INT32;
      const uint64_t c = 33;
      std::vector<std::unique_ptr<Buf>> outs, ins;
      const int send_tags[3] = {1, 2, 1}, recv_tags[3] = {2, 1, 1};
      std::vector<sp_work*> works;
      int st = SP_OK;
      for (int k = 0; k < 3; ++k) {
        outs.push_back(std::make_unique<Buf>(dt, c));
        // Two messages share tag 1: the salt distinguishes them by position.
        outs[k]->fill(0, c, [&](uint64_t i) { return value(dt, SP_SUM, rank_ * 31 + send_tags[k], i, salt + k); });
      }
      for (int k = 0; k < 3; ++k) {
        ins.push_back(std::make_unique<Buf>(dt, c));
        sp_buffer ib = ins[k]->desc();
        sp_work* w = nullptr;
        if (st == SP_OK) st = api_->recv(comm_, &ib, prev, recv_tags[k], &w);
        if (w) works.push_back(w);
      }
      for (int k = 0; k < 3; ++k) {
        sp_buffer ob = outs[k]->desc();
        sp_work* w = nullptr;
        if (st == SP_OK) st = api_->send(comm_, &ob, next, send_tags[k], &w);
        if (w) works.push_back(w);
      }
      int ws = SP_OK;
      for (sp_work* w : works) {
        int s = api_->wait(w, o_.wait_timeout_ms);
        if (ws == SP_OK && s != SP_OK) ws = s;
        api_->release(w);
      }
      const std::string what = "send/recv tag matching (tags 1,2,1 received as 2,1,1)";
      if (st != SP_OK || ws != SP_OK) {
        fail(what, status_error(st != SP_OK ? st : ws));
      } else {
        // recv 0 (tag 2) <- send 1; recv 1 (tag 1) <- send 0; recv 2 (tag 1) <- send 2.
        const int from_send[3] = {1, 0, 2};
        std::string why;
        for (int k = 0; k < 3 && why.empty(); ++k)
          why = compare(dt, ins[k]->data(), c, [&](uint64_t i) {
            return value(dt, SP_SUM, prev * 31 + send_tags[from_send[k]], i, salt + from_send[k]);
          });
        record(what, why);
      }
      salt_ += 3;
    }
  }

  // ------------------------------------------------------------ async

  void run_async() {
    const std::vector<int32_t> dts{SP_FLOAT32, SP_BFLOAT16, SP_INT64};
    std::vector<uint64_t> counts;
    for (uint64_t c : o_.counts)
      if (c == 0 || c == 7 || c == 65537) counts.push_back(c);
    if (counts.empty() && !o_.counts.empty()) counts.push_back(o_.counts.front());
    for (int32_t dt : dts) {
      for (uint64_t c : counts) {
        all_reduce_case(dt, c, OUT, SP_SUM, true);
        all_reduce_case(dt, c, IN, SP_MAX, true);
        reduce_scatter_case(dt, c, OUT, SP_SUM, true);
        all_gather_case(dt, c, OUT, true);
        broadcast_case(dt, c, IN, n_ - 1, true);
        scatter_case(dt, c, OUT, 0, true);
        gather_case(dt, c, OUT, n_ - 1, true);
        all_to_all_case(dt, c, OUT, true);
      }
    }
    {
      sp_work* w = nullptr;
      int st = api_->barrier(comm_, &w);
      if (st == SP_OK) {
        st = api_->wait(w, o_.wait_timeout_ms);
        api_->release(w);
      }
      record("async barrier", st == SP_OK ? "" : status_error(st));
    }
    run_pipeline();
  }

  // Several operations in flight, a blocking one behind them, completion
  // polled with test() on one and waited in reverse order on the others.
  void run_pipeline() {
    const int32_t dt = SP_FLOAT32;
    const uint64_t c = 4099;
    const int k = 4;
    const uint64_t salt0 = salt_ + 1;
    salt_ += k + 1;
    const int32_t ops[k] = {SP_SUM, SP_MAX, SP_MIN, SP_PROD};
    std::vector<std::unique_ptr<Buf>> bufs;
    std::vector<sp_work*> works(k, nullptr);
    int st = SP_OK;
    for (int j = 0; j < k; ++j) {
      bufs.push_back(std::make_unique<Buf>(dt, c));
      bufs[j]->fill(0, c, [&](uint64_t i) { return value(dt, ops[j], rank_, i, salt0 + j); });
      sp_buffer b = bufs[j]->desc();
      if (st == SP_OK) st = api_->all_reduce(comm_, &b, &b, ops[j], &works[j]);
    }
    Buf last(dt, c);
    last.fill(0, c, [&](uint64_t i) { return value(dt, SP_SUM, rank_, i, salt0 + k); });
    sp_buffer lb = last.desc();
    int st_last = st == SP_OK ? api_->all_reduce(comm_, &lb, &lb, SP_SUM, nullptr) : st;
    // The blocking call completed, so everything issued before it has too.
    std::string why;
    if (st != SP_OK) why = "issue " + status_error(st);
    else if (st_last != SP_OK) why = "blocking all_reduce behind async ones " + status_error(st_last);
    if (why.empty() && works[0]) {
      int32_t done = 0;
      int ts = api_->test(works[0], &done);
      if (ts != SP_OK) why = "test " + status_error(ts);
      else if (!done) why = "test() says not done after a later blocking call returned";
    }
    for (int j = k - 1; j >= 0; --j) {
      if (!works[j]) continue;
      int ws = api_->wait(works[j], o_.wait_timeout_ms);
      if (why.empty() && ws != SP_OK) why = "wait #" + std::to_string(j) + " " + status_error(ws);
      api_->release(works[j]);
    }
    for (int j = 0; j < k && why.empty(); ++j)
      why = compare(dt, bufs[j]->data(), c, [&](uint64_t i) { return reduce_ref(dt, ops[j], n_, i, salt0 + j); });
    if (why.empty())
      why = compare(dt, last.data(), c, [&](uint64_t i) { return reduce_ref(dt, SP_SUM, n_, i, salt0 + k); });
    record("async pipeline of 4 all_reduce + blocking all_reduce", why);

    // test() polling until done.
    const uint64_t salt = ++salt_;
    Buf b(dt, c);
    b.fill(0, c, [&](uint64_t i) { return value(dt, SP_SUM, rank_, i, salt); });
    sp_buffer bb = b.desc();
    sp_work* w = nullptr;
    st = api_->all_reduce(comm_, &bb, &bb, SP_SUM, &w);
    why.clear();
    if (st != SP_OK) {
      why = status_error(st);
    } else {
      int32_t done = 0;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(o_.wait_timeout_ms);
      while (!done && why.empty()) {
        int ts = api_->test(w, &done);
        if (ts != SP_OK) why = "test " + status_error(ts);
        else if (!done && std::chrono::steady_clock::now() > deadline) why = "never done";
        else if (!done) std::this_thread::yield();
      }
      api_->release(w);
      if (why.empty()) why = compare(dt, b.data(), c, [&](uint64_t i) { return reduce_ref(dt, SP_SUM, n_, i, salt); });
    }
    record("async all_reduce polled with test()", why);
  }

  // ------------------------------------------------------------ split

  // all_reduce over `sub` whose members are the parent ranks `members`, in
  // sub-rank order.
  void check_sub(const std::string& what, sp_comm* sub, const std::vector<int>& members, uint64_t salt) {
    const int expect_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    const int sr = api_->rank(sub), ss = api_->size(sub);
    if (sr != expect_rank || ss != static_cast<int>(members.size())) {
      fail(what, "rank/size " + std::to_string(sr) + "/" + std::to_string(ss) + ", expected " +
                     std::to_string(expect_rank) + "/" + std::to_string(members.size()));
      return;
    }
    pass();
    const int32_t dt = SP_INT32;
    const uint64_t c = 1023;
    Buf b(dt, c);
    // Contribution keyed by parent rank, so a wrong membership shows.
    b.fill(0, c, [&](uint64_t i) { return value(dt, SP_SUM, rank_, i, salt); });
    sp_buffer bb = b.desc();
    int st = api_->all_reduce(sub, &bb, &bb, SP_SUM, nullptr);
    if (st != SP_OK) return fail(what + " all_reduce", status_error(st));
    record(what + " all_reduce", compare(dt, b.data(), c, [&](uint64_t i) {
             int64_t s = 0;
             for (int m : members) s += value(dt, SP_SUM, m, i, salt);
             return s;
           }));
    st = api_->barrier(sub, nullptr);
    record(what + " barrier", st == SP_OK ? "" : status_error(st));
  }

  void run_split() {
    // Odd/even, ordered by parent rank.
    {
      const uint64_t salt = ++salt_;  // taken on every parent rank, member or not
      sp_comm* sub = nullptr;
      int st = api_->split(comm_, rank_ % 2, rank_, &sub);
      std::vector<int> members;
      for (int j = rank_ % 2; j < n_; j += 2) members.push_back(j);
      if (st != SP_OK || !sub)
        fail("split odd/even", st != SP_OK ? status_error(st) : "returned NULL");
      else
        check_sub("split odd/even", sub, members, salt);
      if (sub) api_->destroy(sub);
    }
    // Reverse order through the key.
    {
      const uint64_t salt = ++salt_;
      sp_comm* sub = nullptr;
      int st = api_->split(comm_, rank_ % 2, -rank_, &sub);
      std::vector<int> members;
      for (int j = rank_ % 2; j < n_; j += 2) members.insert(members.begin(), j);
      if (st != SP_OK || !sub)
        fail("split odd/even reversed by key", st != SP_OK ? status_error(st) : "returned NULL");
      else
        check_sub("split odd/even reversed by key", sub, members, salt);
      if (sub) api_->destroy(sub);
    }
    // Rank 0 opts out with a negative color; the rest form one group.
    {
      const uint64_t salt = ++salt_;
      sp_comm* sub = nullptr;
      int st = api_->split(comm_, rank_ == 0 ? -1 : 0, 0, &sub);
      std::vector<int> members;
      for (int j = 1; j < n_; ++j) members.push_back(j);
      const std::string what = "split with color -1 on rank 0";
      if (st != SP_OK) {
        fail(what, status_error(st));
      } else if (rank_ == 0) {
        record(what, sub ? "returned a communicator for color -1" : "");
      } else if (!sub) {
        fail(what, "returned NULL");
      } else {
        check_sub(what, sub, members, salt);
      }
      if (sub) api_->destroy(sub);
    }
    // The parent still works after its children are gone.
    all_reduce_case(SP_FLOAT32, 7, OUT, SP_SUM, false);
  }

  const sp_comm_api* api_;
  sp_comm* comm_;
  Options o_;
  int rank_;
  int n_;
  uint64_t salt_ = 0;
  Result result_;
};

}  // namespace

Result run_conformance(const sp_comm_api* api, sp_comm* comm, const Options& options) {
  Result r;
  if (!api || !comm) {
    r.failed = 1;
    r.failures.push_back("run_conformance: api or comm is NULL");
    return r;
  }
  struct Scope {  // t_memory for this call only, even when it throws
    explicit Scope(const Memory* m) : saved(t_memory) { t_memory = m; }
    ~Scope() { t_memory = saved; }
    const Memory* saved;
  } scope(&options.memory);
  try {
    return Suite(api, comm, options).run();
  } catch (const std::exception& e) {
    // Memory callbacks report failures by throwing.
    r.failed = 1;
    r.failures.push_back(std::string("run_conformance: ") + e.what());
    return r;
  }
}

}  // namespace conformance
}  // namespace shardplan
