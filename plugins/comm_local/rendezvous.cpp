// create's rendezvous: a process-wide registry of worlds being formed, so the
// threads that create one communicator each end up sharing one Group.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "group.h"
#include "rendezvous.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_plugin.h"

namespace sp_local {
namespace {

using shardplan::comm::fail;

struct Pending {
  int n = 0;
  std::vector<bool> arrived;
  int count = 0;
  bool complete = false;
  std::shared_ptr<Group> group;
  std::condition_variable cv;
};

std::mutex& registry_mu() {
  static auto* mu = new std::mutex();  // leaked: ranks may still create during static destruction
  return *mu;
}
std::map<std::string, std::shared_ptr<Pending>>& registry() {
  static auto* reg = new std::map<std::string, std::shared_ptr<Pending>>();
  return *reg;
}

}  // namespace

int rendezvous(const std::string& id, int rank, int n, int64_t timeout_ms, std::shared_ptr<Group>& out) {
  std::unique_lock<std::mutex> lock(registry_mu());
  auto& reg = registry();
  auto& slot = reg[id];
  if (!slot) {
    slot = std::make_shared<Pending>();
    slot->n = n;
    slot->arrived.assign(n, false);
    slot->group = std::make_shared<Group>(id, n);
  }
  std::shared_ptr<Pending> p = slot;
  if (p->n != n)
    return fail(SP_ERR_INVALID, "local create: rank " + std::to_string(rank) + " says group '" + id + "' has " +
                                    std::to_string(n) + " ranks, an earlier rank said " + std::to_string(p->n));
  if (p->arrived[rank])
    return fail(SP_ERR_INVALID, "local create: rank " + std::to_string(rank) + " of group '" + id +
                                    "' joined twice (is local_id unique per world?)");
  p->arrived[rank] = true;
  if (++p->count == n) {
    // Complete: a later create with the same id starts a new group.
    reg.erase(id);
    p->complete = true;
    p->cv.notify_all();
    out = p->group;
    return SP_OK;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  if (!p->cv.wait_until(lock, deadline, [&] { return p->complete; })) {
    p->arrived[rank] = false;
    --p->count;
    std::string who;
    int k = 0;
    for (int j = 0; j < n; ++j)
      if (!p->arrived[j] && j != rank && k++ < 8) who += (who.empty() ? "" : ", ") + std::to_string(j);
    if (k > 8) who += ", ...";
    if (p->count == 0) {
      auto it = reg.find(id);
      if (it != reg.end() && it->second == p) reg.erase(it);
    }
    return fail(SP_ERR_TIMEOUT, "local create: timed out after " + ms_str(timeout_ms) + " waiting for " +
                                    (k == 1 ? "rank " : "ranks ") + who + " of group '" + id + "'");
  }
  out = p->group;
  return SP_OK;
}

}  // namespace sp_local
