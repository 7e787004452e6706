#pragma once
// Argument checks of the ABI's calls, each failure a one-line message.
#include <cstdint>
#include <string>

#include "comm.h"
#include "errors.h"
#include "reduce.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_plugin.h"

namespace sp_gloo {

inline int check_buffer(const char* op, const char* which, const sp_buffer* b) {
  return shardplan::comm::check_cpu_buffer("gloo", op, which, b);
}

// How send and recv counts relate; rank-major layouts hold one block of the
// other buffer's count per rank.
enum class Counts { kEqual, kRecvPerRank, kSendPerRank, kEqualPerRank };

inline int check_counts(const char* op, const sp_buffer& send, const sp_buffer& recv, Counts counts, int size) {
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

inline int check_pair(const char* op, const sp_buffer* send, const sp_buffer* recv, Counts counts, int size) {
  if (int rc = shardplan::comm::check_cpu_pair("gloo", op, send, recv)) return rc;
  return check_counts(op, *send, *recv, counts, size);
}

// all_reduce and reduce_scatter: the buffers, then the op, whose reduction
// for the buffers' dtype lands in `fn`.
inline int check_reduction(const char* op, const sp_buffer* send, const sp_buffer* recv, Counts counts,
                           int32_t reduce_op, int size, ReduceFn& fn) {
  if (int rc = check_pair(op, send, recv, counts, size)) return rc;
  fn = reduce_fn(recv->dtype, reduce_op);
  if (!fn) return fail(SP_ERR_INVALID, std::string("gloo ") + op + ": unknown reduce op " + std::to_string(reduce_op));
  return SP_OK;
}

inline int check_comm(const char* op, sp_comm* comm) {
  if (!comm || !comm->impl) return fail(SP_ERR_INVALID, std::string("gloo ") + op + ": NULL communicator");
  if (comm->impl->aborted) return fail(SP_ERR_ABORTED, "gloo " + comm->impl->what(op) + ": " + comm->impl->refusal());
  return SP_OK;
}

enum class Side { kSend, kRecv };

// Rooted collectives: the root passes both buffers, the other ranks only the
// one they use (`others_use`).
inline int check_rooted(const char* op, const Comm& c, int32_t root, const sp_buffer* send, const sp_buffer* recv,
                        Counts counts, Side others_use) {
  if (root < 0 || root >= c.size)
    return fail(SP_ERR_INVALID, std::string("gloo ") + op + ": root " + std::to_string(root) +
                                    " is outside the group of " + std::to_string(c.size));
  if (c.rank == root) return check_pair(op, send, recv, counts, c.size);
  return others_use == Side::kSend ? check_buffer(op, "send", send) : check_buffer(op, "recv", recv);
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

}  // namespace sp_gloo
