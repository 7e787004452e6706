// What the communication plugins do alike, written once: the per-thread
// error message behind last_error(), the checks create() starts with,
// buffer validation, passing an abort on to split communicators, and the
// entry point with its sp_comm_api table (SHARDPLAN_COMM_PLUGIN). For backends
// whose operations run to completion on a thread (gloo, mpi),
// comm_worker.h adds the state of one operation, the ABI's wait/test/release
// on it, and the queue that runs a communicator's operations in issue order.
// What belongs to one transport
// (MPI's request polling, NCCL's streams and events, gloo's pairs and
// signals, the local backend's shared-memory protocol) stays in its plugin.
//
// Header-only, C++17 and free of torch and of any transport library, like
// comm_dtype.h: a comm plugin still links nothing but shardplan::abi and its
// transport, and the comm ABI is untouched. Everything here is hidden (as
// shardplan_add_plugin builds plugins anyway), so each loaded plugin keeps its
// own copy, the per-thread error message included, and plugins built from
// different versions of this header never bind to each other's.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "shardplan/abi/comm.h"
#include "shardplan/abi/plugin.h"
#include "shardplan/comm_dtype.h"

#pragma GCC visibility push(hidden)

namespace shardplan {
namespace comm {

// ------------------------------------------------------------------ errors

// The message of this thread's latest failure: what last_error() returns.
inline std::string& last_error() {
  static thread_local std::string message;
  return message;
}

// Records `message` for last_error() and returns `status`.
inline int fail(int status, std::string message) {
  last_error() = std::move(message);
  return status;
}

inline const char* api_last_error() { return last_error().c_str(); }

// ------------------------------------------------------------------ create

constexpr int64_t kDefaultTimeoutMs = 5 * 60 * 1000;

// The checks every create() starts with; clears *out first. Messages read
// "<backend> create: ...".
inline int check_create(const char* backend, const sp_comm_config* config, sp_comm** out) {
  auto bad = [&](const std::string& why) { return fail(SP_ERR_INVALID, std::string(backend) + " create: " + why); };
  if (!out) return bad("out is NULL");
  *out = nullptr;
  if (!config || config->struct_size < sizeof(sp_comm_config)) return bad("config is NULL or from an older ABI");
  if (config->world_size < 1 || config->rank < 0 || config->rank >= config->world_size)
    return bad("rank " + std::to_string(config->rank) + " of world size " + std::to_string(config->world_size));
  return SP_OK;
}

// Calls f(key, value) for each "key=value" of a config's NULL-terminated
// options ("key" alone has an empty value). A backend skips the keys it does
// not know: they are meant for another backend or for the framework.
template <class F>
void for_each_option(const char* const* options, F&& f) {
  for (auto p = options; p && *p; ++p) {
    const std::string kv(*p);
    const auto eq = kv.find('=');
    f(kv.substr(0, eq), eq == std::string::npos ? std::string() : kv.substr(eq + 1));
  }
}

// The communicator's timeout: every blocking step gives up after it.
inline std::chrono::milliseconds timeout_of(const sp_comm_config& config) {
  return std::chrono::milliseconds(config.timeout_ms > 0 ? config.timeout_ms : kDefaultTimeoutMs);
}

// ----------------------------------------------------------------- buffers

// Whether the byte ranges [a, a + an) and [b, b + bn) share a byte.
inline bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return an && bn && pa < pb + bn && pb < pa + an;
}

// One buffer of a backend that moves memory of `device_type` only: NULL, an
// unknown dtype, the other device (`elsewhere` ends that message: "is a CUDA
// buffer; ..."), an unknown device, or elements without data. Messages read
// "<context()>: <which> ..."; context() is called on failure only, so the
// checks cost no allocation on the hot path.
template <class Context>
int check_device_buffer(int32_t device_type, const char* elsewhere, const char* which, const sp_buffer* b,
                        Context&& context) {
  auto bad = [&](int status, const std::string& why) { return fail(status, context() + ": " + which + " " + why); };
  if (!b) return bad(SP_ERR_INVALID, "buffer is NULL");
  if (dtype_size(b->dtype) == 0) return bad(SP_ERR_INVALID, "has unknown dtype " + std::to_string(b->dtype));
  if (b->device_type != device_type) {
    const bool known = b->device_type == SP_DEVICE_CPU || b->device_type == SP_DEVICE_CUDA;
    return known ? bad(SP_ERR_UNSUPPORTED, elsewhere)
                 : bad(SP_ERR_INVALID, "has unknown device type " + std::to_string(b->device_type));
  }
  if (b->count > 0 && !b->data)
    return bad(SP_ERR_INVALID, "has " + std::to_string(b->count) + " elements but no data");
  return SP_OK;
}

// The same for a backend that moves CPU memory only; messages start "<backend> <op>".
inline int check_cpu_buffer(const char* backend, const char* op, const char* which, const sp_buffer* b) {
  return check_device_buffer(SP_DEVICE_CPU, "is a CUDA buffer; this backend moves CPU memory only", which, b,
                             [&] { return std::string(backend) + " " + op; });
}

// Both buffers of a collective, which must hold the same dtype.
inline int check_cpu_pair(const char* backend, const char* op, const sp_buffer* send, const sp_buffer* recv) {
  if (int rc = check_cpu_buffer(backend, op, "send", send)) return rc;
  if (int rc = check_cpu_buffer(backend, op, "recv", recv)) return rc;
  if (send->dtype != recv->dtype)
    return fail(SP_ERR_INVALID, std::string(backend) + " " + op + ": send is " + dtype_name(send->dtype) +
                                    " but recv is " + dtype_name(recv->dtype));
  return SP_OK;
}

// --------------------------------------------------------- split children

// The communicators split from one. The ABI's abort reaches "the ranks
// sharing its group, where the backend can reach them", and within a process
// a backend can: aborting a communicator aborts the children it split off.
template <class Comm>
class Children {
 public:
  // Adds `child`, split from the communicator whose abort flag is
  // `parent_aborted`. An abort that raced with the split looked for children
  // before this one was added, so it is passed on here.
  void adopt(const std::shared_ptr<Comm>& child, const std::atomic<bool>& parent_aborted) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      children_.erase(std::remove_if(children_.begin(), children_.end(),
                                     [](const std::weak_ptr<Comm>& w) { return w.expired(); }),
                      children_.end());
      children_.push_back(child);
    }
    if (parent_aborted) child->abort();
  }

  // Outside the lock: a child's abort goes on to its own children.
  void abort_all() {
    std::vector<std::shared_ptr<Comm>> alive;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& w : children_)
        if (auto c = w.lock()) alive.push_back(std::move(c));
    }
    for (auto& c : alive) c->abort();
  }

 private:
  std::mutex mu_;
  std::vector<std::weak_ptr<Comm>> children_;
};

}  // namespace comm
}  // namespace shardplan

#pragma GCC visibility pop

// Defines the entry point of a communication plugin whose ABI functions are
// ns::api_create, ns::api_split, ... ns::api_release (every field of
// sp_comm_api after `caps` but last_error, which comes from above); `version`
// is sp_plugin_info's free text:
//   SHARDPLAN_COMM_PLUGIN(sp_mpi, "mpi", SP_CAP_CPU | SP_CAP_PROCESS_RANKS, "shardplan mpi plugin 0.1")
// The table is filled field by field, so a plugin lacking a function does not
// compile and none can land in another's slot.
#define SHARDPLAN_COMM_PLUGIN(ns, plugin_name, capabilities, version)                                    \
  extern "C" SP_PLUGIN_EXPORT const sp_plugin_info* shardplan_plugin_entry(void) {                       \
    static const sp_plugin_info info = {                                                                 \
        SP_PLUGIN_ENTRY_VERSION, SP_PLUGIN_COMM, SP_COMM_ABI_VERSION, plugin_name, version,              \
        []() -> const void* {                                                                            \
          static const sp_comm_api api = [] {                                                            \
            sp_comm_api a{};                                                                             \
            a.abi_version = SP_COMM_ABI_VERSION;                                                         \
            a.struct_size = sizeof(sp_comm_api);                                                         \
            a.name = plugin_name;                                                                        \
            a.caps = capabilities;                                                                       \
            a.last_error = &::shardplan::comm::api_last_error;                                           \
            a.create = &ns::api_create;                                                                  \
            a.split = &ns::api_split;                                                                    \
            a.abort = &ns::api_abort;                                                                    \
            a.destroy = &ns::api_destroy;                                                                \
            a.rank = &ns::api_rank;                                                                      \
            a.size = &ns::api_size;                                                                      \
            a.all_reduce = &ns::api_all_reduce;                                                          \
            a.all_gather = &ns::api_all_gather;                                                          \
            a.reduce_scatter = &ns::api_reduce_scatter;                                                  \
            a.broadcast = &ns::api_broadcast;                                                            \
            a.scatter = &ns::api_scatter;                                                                \
            a.gather = &ns::api_gather;                                                                  \
            a.all_to_all = &ns::api_all_to_all;                                                          \
            a.send = &ns::api_send;                                                                      \
            a.recv = &ns::api_recv;                                                                      \
            a.barrier = &ns::api_barrier;                                                                \
            a.wait = &ns::api_wait;                                                                      \
            a.test = &ns::api_test;                                                                      \
            a.release = &ns::api_release;                                                                \
            return a;                                                                                    \
          }();                                                                                           \
          return &api;                                                                                   \
        }};                                                                                              \
    return &info;                                                                                        \
  }
