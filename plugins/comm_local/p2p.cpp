// Send and receive: matching a send with a posted receive, or parking it as
// an eager copy, and failing receives whose deadline passes.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "group.h"
#include "p2p.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_dtype.h"
#include "validation.h"

namespace sp_local {
namespace {

using shardplan::comm::dtype_name;
using shardplan::comm::dtype_size;

std::string recv_timeout_msg(const Op& op, const Group& g) {
  return "local recv: timed out after " + ms_str(op.timeout_ms) + " waiting for rank " + std::to_string(op.d.peer) +
         " (tag " + std::to_string(op.d.tag) + ") of group '" + g.name + "'";
}

// Takes the first receive posted by `dst` that waits for (src, tag); expired
// ones met on the way are failed and dropped. Caller holds p2p_mu.
std::shared_ptr<Op> take_posted(Group& g, int dst, int src, int tag, const Clock::time_point now) {
  auto& posted = g.boxes[dst].posted;
  for (auto it = posted.begin(); it != posted.end();) {
    Op* op = it->get();
    if (op->d.peer != src || op->d.tag != tag) {
      ++it;
      continue;
    }
    std::shared_ptr<Op> found = *it;
    it = posted.erase(it);
    bool expired;
    {
      std::lock_guard<std::mutex> lock(op->m);
      op->posted = false;
      expired = now >= op->deadline;
    }
    if (!expired) return found;
    complete(op, SP_ERR_TIMEOUT, recv_timeout_msg(*op, g));
  }
  return nullptr;
}

// Copies a message into a claimed receive. Returns the sender's status.
int deliver(Op* op, Group& g, int src, const void* data, uint64_t count, int dtype, std::string& msg) {
  const sp_buffer& rb = op->d.recv;
  if (count != rb.count || dtype != rb.dtype) {
    std::string m = "local recv: rank " + std::to_string(src) + " sent " + std::to_string(count) + " " +
                    dtype_name(dtype) + " (tag " + std::to_string(op->d.tag) + ") but the receive on rank " +
                    std::to_string(op->rank) + " of group '" + g.name + "' expects " + std::to_string(rb.count) +
                    " " + dtype_name(rb.dtype);
    msg = "local send" + m.substr(std::strlen("local recv"));
    complete(op, SP_ERR_INVALID, std::move(m));
    return SP_ERR_INVALID;
  }
  if (count) std::memcpy(rb.data, data, count * dtype_size(dtype));
  complete(op, SP_OK, {});
  return SP_OK;
}

}  // namespace

int do_send(Comm* c, const Desc& d, std::string& msg) {
  Group& g = *c->g;
  Local L = validate_p2p(d, c->n);
  if (L.err) {
    msg = L.why;
    return L.err;
  }
  const size_t bytes = d.send.count * dtype_size(d.send.dtype);
  std::unique_lock<std::mutex> lock(g.p2p_mu);
  if (g.aborted.load()) {
    lock.unlock();
    msg = aborted_msg(g, "send");
    return SP_ERR_ABORTED;
  }
  auto target = take_posted(g, d.peer, c->rank, d.tag, Clock::now());
  if (target) {
    lock.unlock();
    return deliver(target.get(), g, c->rank, d.send.data, d.send.count, d.send.dtype, msg);
  }
  lock.unlock();
  // Copy without holding the group's lock, then look again: a receive may
  // have been posted meanwhile.
  Mail mail;
  mail.src = c->rank;
  mail.tag = d.tag;
  mail.dtype = d.send.dtype;
  mail.count = d.send.count;
  mail.data.assign(static_cast<const unsigned char*>(d.send.data),
                   static_cast<const unsigned char*>(d.send.data) + bytes);
  lock.lock();
  target = take_posted(g, d.peer, c->rank, d.tag, Clock::now());
  if (target) {
    lock.unlock();
    return deliver(target.get(), g, c->rank, mail.data.data(), mail.count, mail.dtype, msg);
  }
  g.boxes[d.peer].eager.push_back(std::move(mail));
  return SP_OK;
}

// Completes `op` from a waiting message, or leaves it posted for a sender.
void post_recv(Comm* c, const std::shared_ptr<Op>& op) {
  Group& g = *c->g;
  const Desc& d = op->d;
  Local L = validate_p2p(d, c->n);
  if (L.err) return complete(op.get(), L.err, L.why);
  std::unique_lock<std::mutex> lock(g.p2p_mu);
  if (g.aborted.load()) {
    lock.unlock();
    return complete(op.get(), SP_ERR_ABORTED, aborted_msg(g, "recv"));
  }
  auto& eager = g.boxes[c->rank].eager;
  for (auto it = eager.begin(); it != eager.end(); ++it) {
    if (it->src != d.peer || it->tag != d.tag) continue;
    Mail mail = std::move(*it);
    eager.erase(it);
    lock.unlock();
    std::string ignored;
    deliver(op.get(), g, mail.src, mail.data.data(), mail.count, mail.dtype, ignored);
    return;
  }
  {
    std::lock_guard<std::mutex> l(op->m);
    op->posted = true;
    op->deadline = Clock::now() + std::chrono::milliseconds(c->timeout_ms);
  }
  g.boxes[c->rank].posted.push_back(op);
  lock.unlock();
  op->cv.notify_all();  // waiters learn the deadline
}

void expire_recv(Op* op) {
  Group& g = *op->g;
  std::shared_ptr<Op> found;
  {
    std::lock_guard<std::mutex> lock(g.p2p_mu);
    auto& posted = g.boxes[op->rank].posted;
    for (auto it = posted.begin(); it != posted.end(); ++it) {
      if (it->get() != op) continue;
      found = *it;
      posted.erase(it);
      break;
    }
    if (found) {
      std::lock_guard<std::mutex> l(op->m);
      op->posted = false;
    }
  }
  if (found) complete(op, SP_ERR_TIMEOUT, recv_timeout_msg(*op, g));
}

}  // namespace sp_local
