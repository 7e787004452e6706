// Step 1 of the protocol: each rank checks its own arguments, so a bad call
// is reported in its slot and fails the collective on every rank.
#include <cstdint>
#include <string>
#include <utility>

#include "group.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_dtype.h"
#include "validation.h"

namespace sp_local {
namespace {

using shardplan::comm::dtype_name;
using shardplan::comm::dtype_size;
using shardplan::comm::reduce_op_name;

std::string check_buffer(const char* what, const char* which, const sp_buffer& b) {
  const std::string pre = std::string("local ") + what + ": " + which + " buffer ";
  if (dtype_size(b.dtype) == 0) return pre + "has unknown dtype " + std::to_string(b.dtype);
  if (b.device_type != SP_DEVICE_CPU) return pre + "is not on the CPU (device type " + std::to_string(b.device_type) + ")";
  if (b.count > 0 && b.data == nullptr) return pre + "is NULL with " + std::to_string(b.count) + " elements";
  return {};
}

}  // namespace

Local validate(const Desc& d, int n, int rank) {
  Local L;
  const char* what = kind_name(d.kind);
  auto bad = [&](int st, std::string m) {
    L.err = st;
    L.why = std::move(m);
    return L;
  };
  auto buf = [&](const char* which, const sp_buffer& b) -> bool {
    std::string e = check_buffer(what, which, b);
    if (e.empty()) return true;
    L.err = b.device_type != SP_DEVICE_CPU && dtype_size(b.dtype) ? SP_ERR_UNSUPPORTED : SP_ERR_INVALID;
    L.why = std::move(e);
    return false;
  };
  auto need = [&](bool has, const char* which) -> bool {
    if (has) return true;
    L.err = SP_ERR_INVALID;
    L.why = std::string("local ") + what + ": " + which + " buffer is required";
    return false;
  };
  auto same_dtype = [&]() -> bool {
    if (d.send.dtype == d.recv.dtype) return true;
    L.err = SP_ERR_INVALID;
    L.why = std::string("local ") + what + ": send is " + dtype_name(d.send.dtype) + " but recv is " +
            dtype_name(d.recv.dtype);
    return false;
  };
  auto counts = [&](const char* rule) {
    L.err = SP_ERR_INVALID;
    L.why = std::string("local ") + what + ": send has " + std::to_string(d.send.count) + " elements, recv " +
            std::to_string(d.recv.count) + " (" + rule + ", " + std::to_string(n) + " ranks)";
    return L;
  };
  if (has_op(d.kind) && (d.op < SP_SUM || d.op > SP_PROD))
    return bad(SP_ERR_INVALID, std::string("local ") + what + ": unknown reduce op " + std::to_string(d.op));
  if (has_root(d.kind) && (d.root < 0 || d.root >= n))
    return bad(SP_ERR_INVALID, std::string("local ") + what + ": root " + std::to_string(d.root) +
                                   " is not a rank of a group of " + std::to_string(n));
  const uint64_t un = static_cast<uint64_t>(n);
  switch (d.kind) {
    case K_ALL_REDUCE:
    case K_ALL_GATHER:
    case K_REDUCE_SCATTER:
    case K_ALL_TO_ALL: {
      if (!need(d.has_send, "send") || !need(d.has_recv, "recv") || !buf("send", d.send) ||
          !buf("recv", d.recv) || !same_dtype())
        return L;
      L.dtype = d.send.dtype;
      if (d.kind == K_ALL_REDUCE) {
        if (d.send.count != d.recv.count) return counts("must be equal");
        L.count = d.send.count;
      } else if (d.kind == K_ALL_GATHER) {
        if (d.recv.count / un != d.send.count || d.recv.count % un) return counts("recv must be send x ranks");
        L.count = d.send.count;
      } else if (d.kind == K_REDUCE_SCATTER) {
        if (d.send.count / un != d.recv.count || d.send.count % un) return counts("send must be recv x ranks");
        L.count = d.recv.count;
      } else {
        if (d.send.count != d.recv.count || d.send.count % un)
          return counts("must be equal and divisible by the number of ranks");
        L.count = d.send.count;
      }
      return L;
    }
    case K_BROADCAST: {
      if (rank == d.root) {
        if (!need(d.has_send, "send") || !buf("send", d.send)) return L;
        if (d.has_recv) {
          if (!buf("recv", d.recv) || !same_dtype()) return L;
          if (d.send.count != d.recv.count) return counts("must be equal");
        }
        L.dtype = d.send.dtype;
        L.count = d.send.count;
      } else {
        if (!need(d.has_recv, "recv") || !buf("recv", d.recv)) return L;
        L.dtype = d.recv.dtype;
        L.count = d.recv.count;
      }
      return L;
    }
    case K_SCATTER: {
      if (!need(d.has_recv, "recv") || !buf("recv", d.recv)) return L;
      if (rank == d.root) {
        if (!need(d.has_send, "send") || !buf("send", d.send) || !same_dtype()) return L;
        if (d.send.count / un != d.recv.count || d.send.count % un) return counts("send must be recv x ranks");
      }
      L.dtype = d.recv.dtype;
      L.count = d.recv.count;
      return L;
    }
    case K_GATHER: {
      if (!need(d.has_send, "send") || !buf("send", d.send)) return L;
      if (rank == d.root) {
        if (!need(d.has_recv, "recv") || !buf("recv", d.recv) || !same_dtype()) return L;
        if (d.recv.count / un != d.send.count || d.recv.count % un) return counts("recv must be send x ranks");
      }
      L.dtype = d.send.dtype;
      L.count = d.send.count;
      return L;
    }
    default:
      return L;  // barrier, split
  }
}

std::string describe_slot(const Slot& s) {
  std::string out = kind_name(s.kind);
  if (s.kind == K_BARRIER || s.kind == K_SPLIT) return out;
  out += std::string(" of ") + std::to_string(s.count) + " " + dtype_name(s.dtype);
  if (has_op(s.kind)) out += std::string(" ") + reduce_op_name(s.op);
  if (has_root(s.kind)) out += " root " + std::to_string(s.root);
  return out;
}

Local validate_p2p(const Desc& d, int n) {
  Local L;
  const char* what = kind_name(d.kind);
  const sp_buffer& b = d.kind == K_SEND ? d.send : d.recv;
  if (!(d.kind == K_SEND ? d.has_send : d.has_recv)) {
    L.err = SP_ERR_INVALID;
    L.why = std::string("local ") + what + ": buffer is required";
    return L;
  }
  L.why = check_buffer(what, d.kind == K_SEND ? "send" : "recv", b);
  if (!L.why.empty()) {
    L.err = b.device_type != SP_DEVICE_CPU && dtype_size(b.dtype) ? SP_ERR_UNSUPPORTED : SP_ERR_INVALID;
    return L;
  }
  if (d.peer < 0 || d.peer >= n) {
    L.err = SP_ERR_INVALID;
    L.why = std::string("local ") + what + ": peer " + std::to_string(d.peer) + " is not a rank of a group of " +
            std::to_string(n);
  }
  return L;
}

}  // namespace sp_local
