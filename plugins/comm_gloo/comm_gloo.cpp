// Communication plugin over gloo (CPU, TCP transport). Torch-free: only the
// C ABI headers and gloo.
//
// Every collective of one communicator runs on one thread at a time, in issue
// order: inline on the caller when nothing is queued, else on the
// communicator's worker thread. Collective tags come from a per-communicator
// counter advanced by that executing thread, so all ranks agree on them
// without talking. Point-to-point operations are posted at issue time and only
// their completion is queued: gloo's TCP send waits for the matching receive,
// so posting them in order from the queue would deadlock an isend/irecv
// exchange between two ranks. Messages to oneself (gloo has no pair to self)
// go through an in-process mailbox.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/scatter.h>
#if SHARDPLAN_GLOO_TCP_HEADERS
#include <gloo/transport/tcp/context.h>
#endif
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "reduce.h"
#include "rendezvous.h"
#include "shardplan/abi/comm.h"
#include "shardplan/abi/plugin.h"
#include "shardplan/comm_dtype.h"
#include "shardplan/comm_plugin.h"

namespace sp_gloo {
class Comm;
}  // namespace sp_gloo

struct sp_comm {
  std::shared_ptr<sp_gloo::Comm> impl;
};

namespace sp_gloo {
namespace {

using ms = std::chrono::milliseconds;
using shardplan::comm::dtype_size;
using shardplan::comm::fail;
using shardplan::comm::overlaps;

// Slot prefixes of our own algorithms; gloo's collectives use 0x01..0x08.
constexpr uint8_t kReduceScatterSlotPrefix = 0x21;
constexpr uint8_t kPointToPointSlotPrefix = 0x22;

// gloo writes to its sockets with writev(), so a peer that died raises
// SIGPIPE in whichever thread writes next, and the default action kills the
// whole process before gloo can report the error. SIGPIPE is thread-directed:
// blocking it around our calls (and in threads we start; gloo's event loop
// inherits the mask when the device is created inside such a call) turns it
// into EPIPE without changing how the host process treats its own pipes.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeBlock() {
    // Where SIGPIPE was not blocked before, one pending now was raised by
    // our writes (an earlier one would have been delivered); consume it
    // before unblocking. Where it was blocked, the host handles it.
    if (!sigismember(&old_, SIGPIPE)) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        timespec zero{};
        sigtimedwait(&pipe_, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
};

// gloo prefixes messages with "[file:line] ", sometimes twice; users want
// the cause on one line.
std::string clean(std::string msg) {
  while (msg.size() > 1 && msg[0] == '[') {
    auto close = msg.find("] ");
    if (close == std::string::npos) break;
    msg.erase(0, close + 2);
  }
  std::replace(msg.begin(), msg.end(), '\n', ' ');
  return msg;
}

bool mentions_timeout(const std::string& msg) {
  std::string low(msg);
  std::transform(low.begin(), low.end(), low.begin(), [](unsigned char c) { return std::tolower(c); });
  return low.find("timed out") != std::string::npos || low.find("timeout") != std::string::npos;
}

uint8_t* bytes(const sp_buffer& b, size_t offset = 0) { return static_cast<uint8_t*>(b.data) + offset; }

// gloo's option setters take the element type only for its size.
template <typename F>
void by_element_size(size_t es, F&& f) {
  switch (es) {
    case 1: f(uint8_t{}); break;
    case 2: f(uint16_t{}); break;
    case 4: f(uint32_t{}); break;
    case 8: f(uint64_t{}); break;
    default: GLOO_THROW("unsupported element size ", es);
  }
}

// tcp::Context::signalException is what gloo itself calls when an operation
// times out: it fails every pending buffer and closes every pair. Aborting a
// communicator is exactly that, on demand.
#if SHARDPLAN_GLOO_TCP_HEADERS
// It is protected; naming it through a derived class yields a usable pointer.
struct TcpContextAccess : gloo::transport::tcp::Context {
  static auto signal() { return &TcpContextAccess::signalException; }
};
void fail_pending(gloo::transport::Context* ctx, const std::string& why) {
  (static_cast<gloo::transport::tcp::Context*>(ctx)->*TcpContextAccess::signal())(why);
}
#else
// Some packages (Debian's libgloo-dev 0.5.0) ship tcp/context.h without the
// gloo/common/memory.h it includes, so the class cannot be named. The member
// is exported and non-virtual; on the Itanium C++ ABI a member function takes
// `this` as its first argument, and transport::Context is tcp::Context's
// primary base, so the transport context's address is `this`.
void gloo_tcp_context_signal_exception(void* self, const std::string& why) __asm__(
    "_ZN4gloo9transport3tcp7Context15signalExceptionERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE");
void fail_pending(gloo::transport::Context* ctx, const std::string& why) {
  gloo_tcp_context_signal_exception(ctx, why);
}
#endif

}  // namespace

class Context final : public gloo::rendezvous::Context {
 public:
  using gloo::rendezvous::Context::Context;

  void abort(const std::string& why) {
    // Every context of this plugin comes from a TCP device.
    if (transportContext_) fail_pending(transportContext_.get(), why);
  }
};

// Messages a rank sends to itself (gloo has no pair to self). Sends are
// eager so a blocking send followed by the matching recv cannot deadlock.
class SelfMailbox {
 public:
  struct Recv {
    uint32_t tag = 0;
    void* data = nullptr;
    size_t nbytes = 0;
    bool done = false;
    std::string error;
  };

  void send(uint32_t tag, const void* data, size_t nbytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& waiting = recvs_[tag];
    if (!waiting.empty()) {
      auto r = waiting.front();
      waiting.pop_front();
      deliver(*r, data, nbytes);
    } else {
      auto p = static_cast<const uint8_t*>(data);
      sent_[tag].emplace_back(p, p + nbytes);
    }
    cv_.notify_all();
  }

  std::shared_ptr<Recv> post_recv(uint32_t tag, void* data, size_t nbytes) {
    auto r = std::make_shared<Recv>();
    r->tag = tag;
    r->data = data;
    r->nbytes = nbytes;
    std::lock_guard<std::mutex> lock(mu_);
    auto& queued = sent_[tag];
    if (!queued.empty()) {
      deliver(*r, queued.front().data(), queued.front().size());
      queued.pop_front();
    } else {
      recvs_[tag].push_back(r);
    }
    return r;
  }

  // Throws like a gloo wait would, so errors map the same way.
  void wait(Recv& r, ms timeout, const std::atomic<bool>& aborted) {
    std::unique_lock<std::mutex> lock(mu_);
    bool finished = cv_.wait_for(lock, timeout, [&] { return r.done || aborted; });
    if (!r.done) {
      // The caller may free the buffer once we give up on it.
      auto& waiting = recvs_[r.tag];
      waiting.erase(std::remove_if(waiting.begin(), waiting.end(),
                                   [&](const std::shared_ptr<Recv>& p) { return p.get() == &r; }),
                    waiting.end());
      if (!finished)
        throw gloo::IoException("Timed out waiting " + std::to_string(timeout.count()) +
                                "ms for a message this rank sent to itself");
      throw gloo::IoException("aborted while waiting for a message this rank sent to itself");
    }
    if (!r.error.empty()) throw gloo::Exception(r.error);
  }

  void wake() { cv_.notify_all(); }

 private:
  static void deliver(Recv& r, const void* data, size_t nbytes) {
    if (nbytes != r.nbytes)
      r.error = "message to self has " + std::to_string(nbytes) + " bytes but the recv buffer " +
                std::to_string(r.nbytes);
    else if (nbytes)
      std::memcpy(r.data, data, nbytes);
    r.done = true;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint32_t, std::deque<std::vector<uint8_t>>> sent_;
  std::map<uint32_t, std::deque<std::shared_ptr<Recv>>> recvs_;
};

class Comm {
 public:
  Comm(int rank, int size, ms timeout, std::shared_ptr<KeyStore> store, std::string prefix,
       std::shared_ptr<gloo::transport::Device> device)
      : rank(rank), size(size), timeout(timeout), store(std::move(store)), prefix(std::move(prefix)),
        device(std::move(device)) {}

  ~Comm() { queue_.stop(); }

  const int rank;
  const int size;
  const ms timeout;
  const std::shared_ptr<KeyStore> store;  // shared by every split of one root
  const std::string prefix;               // this communicator's keys in `store`
  const std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<Context> ctx;
  std::atomic<bool> aborted{false};
  uint32_t split_seq = 0;  // advanced by the executing thread only
  SelfMailbox self;

  // `cancel`: the abort flag of whoever else is waiting for this connect
  // (the parent of a split).
  void connect(const std::atomic<bool>* cancel = nullptr) {
    ctx = std::make_shared<Context>(rank, size);
    ctx->setTimeout(timeout);
    auto dev = device;
    if (cancel) {
      InterruptibleStore interruptible(*store, *cancel, timeout);
      gloo::rendezvous::PrefixStore ps(prefix, interruptible);
      ctx->connectFullMesh(ps, dev);
    } else {
      gloo::rendezvous::PrefixStore ps(prefix, *store);
      ctx->connectFullMesh(ps, dev);
    }
  }

  uint32_t next_tag() { return tag_++; }

  std::string what(const char* op) const {
    return std::string(op) + " on rank " + std::to_string(rank) + " of " + std::to_string(size);
  }

  // Runs `run` in issue order. work == nullptr: blocks and returns its status.
  template <class F>
  int submit(const char* op, F&& run, sp_work** work) {
    const shardplan::comm::OpInfo info{"gloo", op, rank, size, timeout};
    int status;
    if (!work && queue_.run_inline(info, [&](std::string& err) { return execute(run, err); }, &status)) return status;
    return queue_.submit(info, std::function<void()>(std::forward<F>(run)), work);
  }

  void abort() {
    aborted = true;
    if (ctx) ctx->abort("communicator aborted");
    self.wake();
    children.abort_all();
  }

  shardplan::comm::Children<Comm> children;

 private:
  template <class F>
  int execute(F& run, std::string& err) {
    if (aborted) {
      err = "the communicator was aborted";
      return SP_ERR_ABORTED;
    }
    int status = SP_OK;
    try {
      run();
    } catch (const RendezvousError& e) {
      status = e.status();
      err = clean(e.what());
    } catch (const gloo::IoException& e) {
      err = clean(e.what());
      status = mentions_timeout(err) ? SP_ERR_TIMEOUT : SP_ERR_INTERNAL;
    } catch (const std::exception& e) {
      status = SP_ERR_INTERNAL;
      err = clean(e.what());
    } catch (...) {
      status = SP_ERR_INTERNAL;
      err = "unknown error";
    }
    if (status != SP_OK && aborted) {
      status = SP_ERR_ABORTED;
      err = "the communicator was aborted (" + err + ")";
    }
    return status;
  }

  // SIGPIPE stays blocked for good on the worker, which only ever runs gloo.
  static void block_sigpipe() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  }

  uint32_t tag_ = 0;
  shardplan::comm::InOrderQueue<std::function<void()>> queue_{
      [this](std::function<void()>& run, std::string& err) { return execute(run, err); }, &block_sigpipe};
};

namespace {

// ------------------------------------------------------------ running gloo

// Runs one of gloo's collectives on `c`: `fill` completes its options, which
// already carry the communicator's timeout and its next tag, drawn by the
// executing thread in issue order so that all ranks agree on it without
// talking.
template <typename Opts, typename Fill>
void run_gloo(Comm& c, void (*collective)(Opts&), Fill&& fill) {
  std::remove_const_t<Opts> o(c.ctx);
  o.setTag(c.next_tag());
  o.setTimeout(c.timeout);
  fill(o);
  collective(o);
}

// The same over buffers of `es`-byte elements: `fill(o, e)` also gets a value
// e of an unsigned type of that size, for gloo's typed setters.
template <typename Opts, typename Fill>
void run_gloo(Comm& c, size_t es, void (*collective)(Opts&), Fill&& fill) {
  by_element_size(es, [&](auto e) { run_gloo(c, collective, [&](auto& o) { fill(o, e); }); });
}

// The same for a collective with a root.
template <typename Opts, typename Fill>
void run_gloo(Comm& c, size_t es, int32_t root, void (*collective)(Opts&), Fill&& fill) {
  run_gloo(c, es, collective, [&](auto& o, auto e) {
    o.setRoot(root);
    fill(o, e);
  });
}

// What gloo should read for an input of n bytes at p: p itself, or a private
// copy when this collective's own writes may land there first.
class StableInput {
 public:
  StableInput(uint8_t* p, size_t n, bool overwritten) : data_(p) {
    if (!overwritten) return;
    copy_.assign(p, p + n);
    data_ = copy_.data();
  }
  StableInput(const StableInput&) = delete;
  StableInput& operator=(const StableInput&) = delete;

  uint8_t* data() const { return data_; }

 private:
  std::vector<uint8_t> copy_;
  uint8_t* data_;
};

// At the root of scatter and gather: whether a rank's own buffer of one block
// overlaps the root's buffer of one block per rank other than as the root's
// own block (that in-place layout is safe).
bool overlaps_other_blocks(const void* own, const sp_buffer& blocks, size_t block_bytes, const Comm& c, int32_t root) {
  return own != bytes(blocks, block_bytes * root) && overlaps(own, block_bytes, blocks.data, block_bytes * c.size);
}

// ------------------------------------------------------------ validation

int check_buffer(const char* op, const char* which, const sp_buffer* b) {
  return shardplan::comm::check_cpu_buffer("gloo", op, which, b);
}

// How send and recv counts relate; rank-major layouts hold one block of the
// other buffer's count per rank.
enum class Counts { kEqual, kRecvPerRank, kSendPerRank, kEqualPerRank };

int check_counts(const char* op, const sp_buffer& send, const sp_buffer& recv, Counts counts, int size) {
  auto n = [](uint64_t count) { return std::to_string(count); };
  std::string what;
  switch (counts) {
    case Counts::kEqual:
      if (send.count == recv.count) return SP_OK;
      what = "send has " + n(send.count) + " elements but recv has " + n(recv.count);
      break;
    case Counts::kRecvPerRank:
      if (recv.count == send.count * size) return SP_OK;
      what = "recv has " + n(recv.count) + " elements, expected send's " + n(send.count) + " x " + n(size) + " ranks";
      break;
    case Counts::kSendPerRank:
      if (send.count == recv.count * size) return SP_OK;
      what = "send has " + n(send.count) + " elements, expected recv's " + n(recv.count) + " x " + n(size) + " ranks";
      break;
    case Counts::kEqualPerRank:
      if (send.count == recv.count && send.count % size == 0) return SP_OK;
      what = "send has " + n(send.count) + " and recv " + n(recv.count) +
             " elements; both must be equal and divisible by " + n(size);
      break;
  }
  return fail(SP_ERR_INVALID, std::string("gloo ") + op + ": " + what);
}

int check_pair(const char* op, const sp_buffer* send, const sp_buffer* recv, Counts counts, int size) {
  if (int rc = shardplan::comm::check_cpu_pair("gloo", op, send, recv)) return rc;
  return check_counts(op, *send, *recv, counts, size);
}

// all_reduce and reduce_scatter: the buffers, then the op, whose reduction
// for the buffers' dtype lands in `fn`.
int check_reduction(const char* op, const sp_buffer* send, const sp_buffer* recv, Counts counts, int32_t reduce_op,
                    int size, ReduceFn& fn) {
  if (int rc = check_pair(op, send, recv, counts, size)) return rc;
  fn = reduce_fn(recv->dtype, reduce_op);
  if (!fn) return fail(SP_ERR_INVALID, std::string("gloo ") + op + ": unknown reduce op " + std::to_string(reduce_op));
  return SP_OK;
}

int check_comm(const char* op, sp_comm* comm) {
  if (!comm || !comm->impl) return fail(SP_ERR_INVALID, std::string("gloo ") + op + ": NULL communicator");
  if (comm->impl->aborted)
    return fail(SP_ERR_ABORTED, "gloo " + comm->impl->what(op) + ": the communicator was aborted");
  return SP_OK;
}

enum class Side { kSend, kRecv };

// Rooted collectives: the root passes both buffers, the other ranks only the
// one they use (`others_use`).
int check_rooted(const char* op, const Comm& c, int32_t root, const sp_buffer* send, const sp_buffer* recv,
                 Counts counts, Side others_use) {
  if (root < 0 || root >= c.size)
    return fail(SP_ERR_INVALID, std::string("gloo ") + op + ": root " + std::to_string(root) +
                                    " is outside the group of " + std::to_string(c.size));
  if (c.rank == root) return check_pair(op, send, recv, counts, c.size);
  return others_use == Side::kSend ? check_buffer(op, "send", send) : check_buffer(op, "recv", recv);
}

template <typename Fn>
int guarded(const char* op, Fn&& fn) {
  SigpipeBlock no_sigpipe;
  try {
    return fn();
  } catch (const RendezvousError& e) {
    return fail(e.status(), std::string("gloo ") + op + ": " + clean(e.what()));
  } catch (const gloo::IoException& e) {
    std::string m = clean(e.what());
    return fail(mentions_timeout(m) ? SP_ERR_TIMEOUT : SP_ERR_INTERNAL, std::string("gloo ") + op + ": " + m);
  } catch (const std::exception& e) {
    return fail(SP_ERR_INTERNAL, std::string("gloo ") + op + ": " + clean(e.what()));
  } catch (...) {
    return fail(SP_ERR_INTERNAL, std::string("gloo ") + op + ": unknown error");
  }
}

// The frame of every operation on a communicator: the communicator is checked
// first, and any exception becomes a status whose message names `op`.
template <typename Fn>
int on_comm(const char* op, sp_comm* comm, Fn&& fn) {
  return guarded(op, [&]() -> int {
    if (int rc = check_comm(op, comm)) return rc;
    return fn(op, comm->impl.get());
  });
}

// ---------------------------------------------------------------- create

struct Options {
  std::string local_addr;
  std::string iface;
  std::string file_store;
  std::string prefix;
};

Options parse_options(const char* const* options) {
  Options o;
  shardplan::comm::for_each_option(options, [&](const std::string& k, const std::string& v) {
    if (k == "local_addr") o.local_addr = v;
    else if (k == "iface") o.iface = v;
    else if (k == "file_store") o.file_store = v;
    else if (k == "prefix") o.prefix = v;
  });
  return o;
}

int api_create(const sp_comm_config* config, sp_comm** out) {
  if (int rc = shardplan::comm::check_create("gloo", config, out)) return rc;
  const int rank = config->rank, size = config->world_size;
  const ms timeout = shardplan::comm::timeout_of(*config);
  Options opt = parse_options(config->options);
  const std::string op = "create (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")";
  const std::string who = "gloo " + op;

  return guarded(op.c_str(), [&]() -> int {
    std::shared_ptr<KeyStore> store;
    if (config->store) store = std::make_shared<HostStore>(*config->store, timeout);
    else if (!opt.file_store.empty()) store = std::make_shared<DirStore>(opt.file_store, timeout);
    else if (size == 1) store = std::make_shared<SoloStore>(timeout);
    else return fail(SP_ERR_INVALID, who + ": no rendezvous: pass a store or the option file_store=<dir>");

    gloo::transport::tcp::attr attr;
    if (!opt.iface.empty()) attr.iface = opt.iface;
    else attr.hostname = opt.local_addr.empty() ? "127.0.0.1" : opt.local_addr;
    std::shared_ptr<gloo::transport::Device> device;
    try {
      device = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      return fail(SP_ERR_INVALID, who + ": cannot listen on " + (opt.iface.empty() ? attr.hostname : opt.iface) +
                                      ": " + clean(e.what()));
    }

    // A store may outlive one world (tests create several in a row); each
    // rank counts its own earlier worlds on it, and all ranks count alike.
    std::string prefix = opt.prefix;
    if (prefix.empty()) {
      int gen = 0;
      auto key = [&](int g) { return "gloo/gen/" + std::to_string(g) + "/" + std::to_string(rank); };
      while (store->check(key(gen))) ++gen;
      store->set(key(gen), {'1'});
      prefix = "gloo/" + std::to_string(gen);
    }

    auto comm = std::make_shared<Comm>(rank, size, timeout, store, prefix, device);
    comm->connect();
    *out = new sp_comm{comm};
    return SP_OK;
  });
}

// ----------------------------------------------------------------- split

int api_split(sp_comm* parent, int32_t color, int32_t key, sp_comm** out) {
  if (!out) return fail(SP_ERR_INVALID, "gloo split: out is NULL");
  *out = nullptr;
  if (int rc = check_comm("split", parent)) return rc;
  SigpipeBlock no_sigpipe;
  Comm* p = parent->impl.get();
  std::shared_ptr<Comm> child;
  int rc = p->submit(
      "split",
      [&] {
        int32_t mine[2] = {color, key};
        std::vector<int32_t> all(2 * static_cast<size_t>(p->size));
        run_gloo(*p, gloo::allgather, [&](auto& o) {
          o.setInput(mine, 2);
          o.setOutput(all.data(), all.size());
        });
        uint32_t seq = p->split_seq++;
        if (color < 0) return;

        std::vector<std::pair<int32_t, int>> members;  // (key, parent rank)
        for (int r = 0; r < p->size; ++r)
          if (all[2 * r] == color) members.emplace_back(all[2 * r + 1], r);
        std::sort(members.begin(), members.end());
        int new_rank = 0;
        while (members[new_rank].second != p->rank) ++new_rank;

        auto c = std::make_shared<Comm>(new_rank, static_cast<int>(members.size()), p->timeout, p->store,
                                        p->prefix + "/split/" + std::to_string(seq) + "/" + std::to_string(color),
                                        p->device);
        c->connect(&p->aborted);
        child = std::move(c);
      },
      nullptr);
  if (rc != SP_OK) return rc;
  if (child) {
    p->children.adopt(child, p->aborted);
    *out = new sp_comm{child};
  }
  return SP_OK;
}

int api_abort(sp_comm* comm) {
  if (!comm || !comm->impl) return fail(SP_ERR_INVALID, "gloo abort: NULL communicator");
  SigpipeBlock no_sigpipe;
  try {
    comm->impl->abort();
  } catch (const std::exception& e) {
    return fail(SP_ERR_INTERNAL, std::string("gloo abort: ") + clean(e.what()));
  }
  return SP_OK;
}

void api_destroy(sp_comm* comm) {
  SigpipeBlock no_sigpipe;
  try {
    delete comm;
  } catch (...) {
  }
}

int32_t api_rank(const sp_comm* comm) { return comm && comm->impl ? comm->impl->rank : -1; }
int32_t api_size(const sp_comm* comm) { return comm && comm->impl ? comm->impl->size : -1; }

// ----------------------------------------------------------- collectives

// Queues a collective whose arguments are valid: `run(c, s, r, es)` executes
// in issue order with copies of the descriptors (an async call's need not
// outlive the call) and their element size, and not at all when there are no
// elements to move.
template <typename Run>
int submit_collective(Comm* c, const char* name, const sp_buffer& send, const sp_buffer& recv, sp_work** work,
                      Run run) {
  const size_t es = dtype_size(recv.dtype);
  return c->submit(
      name,
      [c, s = send, r = recv, es, run] {
        if (r.count > 0) run(*c, s, r, es);
      },
      work);
}

// all_gather and all_to_all: every rank passes both buffers.
template <typename Run>
int paired_collective(const char* op, sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, Counts counts,
                      sp_work** work, Run run) {
  return on_comm(op, comm, [&](const char* name, Comm* c) -> int {
    if (int rc = check_pair(name, send, recv, counts, c->size)) return rc;
    return submit_collective(c, name, *send, *recv, work, run);
  });
}

// all_reduce and reduce_scatter: paired collectives whose `run` also gets the
// reduction for the buffers' dtype, last.
template <typename Run>
int reduction_collective(const char* op, sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, Counts counts,
                         int32_t reduce_op, sp_work** work, Run run) {
  return on_comm(op, comm, [&](const char* name, Comm* c) -> int {
    ReduceFn fn = nullptr;
    if (int rc = check_reduction(name, send, recv, counts, reduce_op, c->size, fn)) return rc;
    auto run_with_fn = [fn, run](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es) { run(c, s, r, es, fn); };
    return submit_collective(c, name, *send, *recv, work, run_with_fn);
  });
}

// broadcast, scatter and gather. A rank other than the root passes only the
// buffer it uses (`others_use`), which then stands in for the other one.
// `run` gets whether this rank is the root, last.
template <typename Run>
int rooted_collective(const char* op, sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root,
                      Counts counts, Side others_use, sp_work** work, Run run) {
  return on_comm(op, comm, [&](const char* name, Comm* c) -> int {
    if (int rc = check_rooted(name, *c, root, send, recv, counts, others_use)) return rc;
    const bool is_root = c->rank == root;
    const sp_buffer& mine = others_use == Side::kSend ? *send : *recv;
    auto run_as = [is_root, run](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es) {
      run(c, s, r, es, is_root);
    };
    return submit_collective(c, name, is_root ? *send : mine, is_root ? *recv : mine, work, run_as);
  });
}

int api_all_reduce(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t op, sp_work** work) {
  return reduction_collective(
      "all_reduce", comm, send, recv, Counts::kEqual, op, work,
      [](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es, ReduceFn fn) {
        // Copying first and reducing in place costs what gloo's own
        // out-of-place path costs (it copies per segment) and survives
        // any overlap of send and recv.
        if (s.data != r.data) std::memmove(r.data, s.data, r.count * es);
        run_gloo(c, es, gloo::allreduce, [&](auto& o, auto e) {
          o.setOutput(static_cast<decltype(e)*>(r.data), r.count);
          o.setReduceFunction(fn);
        });
      });
}

int api_all_gather(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, sp_work** work) {
  return paired_collective(
      "all_gather", comm, send, recv, Counts::kRecvPerRank, work,
      [](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es) {
        size_t chunk = s.count * es;
        uint8_t* mine = bytes(r, chunk * c.rank);
        if (s.data != mine) std::memmove(mine, s.data, chunk);
        run_gloo(c, es, gloo::allgather, [&](auto& o, auto e) {
          o.setOutput(static_cast<decltype(e)*>(r.data), r.count);
        });
      });
}

// Ring reduce-scatter: in step s this rank sends the partial sum of chunk
// (rank - s - 1) to the right and receives chunk (rank - s - 2) from the
// left, which it reduces with its own copy of that chunk. After size - 1
// steps the chunk received last is this rank's, fully reduced. recv is only
// written in the last step, when send is no longer read except for this
// rank's own chunk, so recv == send works as in-place.
void ring_reduce_scatter(Comm& c, const sp_buffer& s, const sp_buffer& r, ReduceFn fn, size_t es) {
  const size_t n = r.count, chunk = n * es;
  const int P = c.size, me = c.rank;
  if (P == 1) {
    std::memmove(r.data, s.data, chunk);
    return;
  }
  uint8_t* const own = bytes(s, chunk * me);
  const StableInput own_chunk(own, chunk,
                              r.data != s.data && r.data != own && overlaps(r.data, chunk, s.data, chunk * P));
  auto chunk_of = [&](int i) -> const uint8_t* { return i == me ? own_chunk.data() : bytes(s, chunk * i); };

  const auto slot = gloo::Slot::build(kReduceScatterSlotPrefix, c.next_tag());
  const int right = (me + 1) % P, left = (me + P - 1) % P;
  std::vector<uint8_t> incoming(chunk), partial(chunk);
  auto in_buf = c.ctx->createUnboundBuffer(incoming.data(), chunk);
  auto partial_buf = c.ctx->createUnboundBuffer(partial.data(), chunk);
  auto send_buf = c.ctx->createUnboundBuffer(s.data, chunk * P);
  for (int step = 0; step < P - 1; ++step) {
    in_buf->recv(left, slot, 0, chunk);
    auto& out_buf = step == 0 ? send_buf : partial_buf;
    out_buf->send(right, slot, step == 0 ? chunk * ((me + P - 1) % P) : 0, chunk);
    in_buf->waitRecv(c.timeout);
    out_buf->waitSend(c.timeout);
    const int idx = ((me - step - 2) % P + P) % P;
    void* dst = step == P - 2 ? r.data : partial.data();
    fn(dst, incoming.data(), chunk_of(idx), n);
  }
}

int api_reduce_scatter(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t op, sp_work** work) {
  return reduction_collective(
      "reduce_scatter", comm, send, recv, Counts::kSendPerRank, op, work,
      [](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es, ReduceFn fn) {
        ring_reduce_scatter(c, s, r, fn, es);
      });
}

int api_broadcast(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work) {
  return rooted_collective(
      "broadcast", comm, send, recv, root, Counts::kEqual, Side::kRecv, work,
      [root](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es, bool is_root) {
        if (is_root && s.data != r.data) std::memmove(r.data, s.data, r.count * es);
        run_gloo(c, es, root, gloo::broadcast, [&](auto& o, auto e) {
          o.setOutput(static_cast<decltype(e)*>(r.data), r.count);
        });
      });
}

int api_scatter(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work) {
  return rooted_collective(
      "scatter", comm, send, recv, root, Counts::kSendPerRank, Side::kRecv, work,
      [root](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es, bool is_root) {
        const size_t chunk = r.count * es;
        // The root's sends are still in flight when gloo copies its own block
        // into recv.
        const StableInput src(bytes(s), chunk * c.size, is_root && overlaps_other_blocks(r.data, s, chunk, c, root));
        run_gloo(c, es, root, gloo::scatter, [&](auto& o, auto e) {
          using E = decltype(e);
          if (is_root) {
            std::vector<E*> blocks;
            for (int i = 0; i < c.size; ++i) blocks.push_back(reinterpret_cast<E*>(src.data() + chunk * i));
            o.setInputs(blocks, r.count);
          }
          o.setOutput(static_cast<E*>(r.data), r.count);
        });
      });
}

int api_gather(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work) {
  return rooted_collective(
      "gather", comm, send, recv, root, Counts::kRecvPerRank, Side::kSend, work,
      [root](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es, bool is_root) {
        const size_t chunk = s.count * es;
        // Peers' blocks land in recv before gloo copies ours; an input
        // overlapping another rank's block must be read first.
        const StableInput src(bytes(s), chunk, is_root && overlaps_other_blocks(s.data, r, chunk, c, root));
        run_gloo(c, es, root, gloo::gather, [&](auto& o, auto e) {
          using E = decltype(e);
          o.setInput(reinterpret_cast<E*>(src.data()), s.count);
          if (is_root) o.setOutput(static_cast<E*>(r.data), r.count);
        });
      });
}

int api_all_to_all(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, sp_work** work) {
  return paired_collective(
      "all_to_all", comm, send, recv, Counts::kEqualPerRank, work,
      [](Comm& c, const sp_buffer& s, const sp_buffer& r, size_t es) {
        const size_t total = r.count * es;
        const StableInput src(bytes(s), total, overlaps(s.data, total, r.data, total));
        run_gloo(c, es, gloo::alltoall, [&](auto& o, auto e) {
          using E = decltype(e);
          o.setInput(reinterpret_cast<E*>(src.data()), s.count);
          o.setOutput(static_cast<E*>(r.data), r.count);
        });
      });
}

int point_to_point(bool is_send, sp_comm* comm, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work) {
  return on_comm(is_send ? "send" : "recv", comm, [&](const char* name, Comm* c) -> int {
    if (int rc = check_buffer(name, "buffer", buf)) return rc;
    if (peer < 0 || peer >= c->size)
      return fail(SP_ERR_INVALID, "gloo " + c->what(name) + ": peer " + std::to_string(peer) +
                                      " is outside the group of " + std::to_string(c->size));
    const size_t nbytes = buf->count * dtype_size(buf->dtype);
    if (peer == c->rank) {
      std::shared_ptr<SelfMailbox::Recv> r;
      if (is_send) c->self.send(static_cast<uint32_t>(tag), buf->data, nbytes);
      else r = c->self.post_recv(static_cast<uint32_t>(tag), buf->data, nbytes);
      return c->submit(
          name,
          [c, r] {
            if (r) c->self.wait(*r, c->timeout, c->aborted);
          },
          work);
    }
    std::shared_ptr<gloo::transport::UnboundBuffer> ub;
    if (nbytes > 0) {
      ub = c->ctx->createUnboundBuffer(buf->data, nbytes);
      const auto slot = gloo::Slot::build(kPointToPointSlotPrefix, static_cast<uint32_t>(tag));
      if (is_send) ub->send(peer, slot, 0, nbytes);
      else ub->recv(peer, slot, 0, nbytes);
    }
    ms timeout = c->timeout;
    return c->submit(
        name,
        [ub, is_send, timeout] {
          if (!ub) return;
          if (is_send) ub->waitSend(timeout);
          else ub->waitRecv(timeout);
        },
        work);
  });
}

int api_send(sp_comm* comm, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work) {
  return point_to_point(true, comm, buf, peer, tag, work);
}

int api_recv(sp_comm* comm, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work) {
  return point_to_point(false, comm, buf, peer, tag, work);
}

int api_barrier(sp_comm* comm, sp_work** work) {
  return on_comm("barrier", comm, [&](const char* name, Comm* c) -> int {
    return c->submit(name, [c] { run_gloo(*c, gloo::barrier, [](auto&) {}); }, work);
  });
}

// ------------------------------------------------------------------ work

// Every gloo operation gives up after the communicator's timeout by itself;
// wait()'s margin beyond that only guards against a transport that never answers.
int api_wait(sp_work* work, int64_t timeout_ms) {
  return shardplan::comm::wait_work("gloo", work, timeout_ms, "the transport");
}

int api_test(sp_work* work, int32_t* done) { return shardplan::comm::test_work("gloo", work, done); }

void api_release(sp_work* work) { shardplan::comm::release_work(work); }

}  // namespace
}  // namespace sp_gloo

SHARDPLAN_COMM_PLUGIN(sp_gloo, "gloo", SP_CAP_CPU | SP_CAP_THREAD_RANKS | SP_CAP_PROCESS_RANKS,
                      "shardplan gloo plugin 0.1 (gloo 0.5.0, TCP)")
