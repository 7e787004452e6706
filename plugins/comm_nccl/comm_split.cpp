// Comm::split: a collective over a communicator that makes its children,
// through ncclCommSplit where NCCL has it, else through the store.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm.h"
#include "nccl_support.h"
#include "shardplan/abi/comm.h"
#include "store.h"

namespace sp_nccl {

int Comm::split(int32_t color, int32_t key, std::shared_ptr<Comm>* out, std::string* err) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted || !nccl) {
    *err = "the communicator was aborted";
    return SP_ERR_ABORTED;
  }
  DeviceGuard g(device);
  flush_locked();
  const uint32_t seq = split_seq_++;
  const std::string child_prefix = prefix + "/split/" + std::to_string(seq) + "/" + std::to_string(color);
#if SP_NCCL_HAS_COMM_SPLIT
  if (!split_via_store) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    split_slot_ = nullptr;
    ncclResult_t r = ncclCommSplit(nccl, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &split_slot_, &config);
    int rc = settle_split(r, color >= 0, &split_slot_, Clock::now() + timeout, err);
    ncclComm_t child = __atomic_load_n(&split_slot_, __ATOMIC_ACQUIRE);
    if (rc != SP_OK) {
      *err = "ncclCommSplit: " + *err;
      if (child) ncclCommAbort(child);
      if (rc == SP_ERR_TIMEOUT) {
        *err += " (" + std::to_string(timeout.count()) + " ms); communicator aborted";
        abort_locked();
      }
      return rc;
    }
    if (!child) return SP_OK;
    int child_rank = 0, child_size = 0;
    ncclCommUserRank(child, &child_rank);
    ncclCommCount(child, &child_size);
    auto c = std::make_shared<Comm>(child_rank, child_size, device, timeout, store, child_prefix, split_via_store);
    if (int crc = c->init(nullptr, child, &aborted, err)) return crc;
    *out = std::move(c);
    return SP_OK;
  }
#endif
  return split_through_store(seq, color, key, child_prefix, out, err);
}

int Comm::settle_split(ncclResult_t r, bool want_child, ncclComm_t* child, Clock::time_point deadline,
                       std::string* err) {
  Backoff backoff;
  while (true) {
    if (r != ncclSuccess && r != ncclInProgress) {
      *err = nccl_msg(nccl, r);
      return status_of(r);
    }
    // The child first: the parent's "ready" counts only once it was read
    // after the hand-over.
    ncclComm_t c = __atomic_load_n(child, __ATOMIC_ACQUIRE);
    ncclResult_t parent = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(nccl, &parent);
    if (q != ncclSuccess) parent = q;
    if (parent != ncclSuccess && parent != ncclInProgress) {
      *err = nccl_msg(nccl, parent);
      return status_of(parent);
    }
    ncclResult_t mine = want_child ? ncclInProgress : ncclSuccess;
    if (c) {
      q = ncclCommGetAsyncError(c, &mine);
      if (q != ncclSuccess) mine = q;
      if (mine != ncclSuccess && mine != ncclInProgress) {
        *err = nccl_msg(c, mine);
        return status_of(mine);
      }
    }
    if (parent == ncclSuccess && mine == ncclSuccess) return SP_OK;
    if (aborted) {
      *err = "the communicator was aborted";
      return SP_ERR_ABORTED;
    }
    if (Clock::now() > deadline) {
      *err = std::string("NCCL did not finish the split within the communicator's timeout (parent ") +
             (parent == ncclInProgress ? "in progress" : "ready") + ", new communicator " +
             (c ? (mine == ncclInProgress ? "in progress" : "ready") : "not handed over") + ")";
      return SP_ERR_TIMEOUT;
    }
    backoff.pause();
    r = ncclSuccess;
  }
}

int Comm::split_through_store(uint32_t seq, int32_t color, int32_t key, const std::string& child_prefix,
                              std::shared_ptr<Comm>* out, std::string* err) {
  std::vector<std::pair<int32_t, int>> members;  // (key, parent rank) of our color
  if (size == 1) {
    if (color >= 0) members.emplace_back(key, 0);
  } else {
    if (!store) {
      *err = "split through the store, but this communicator has none";
      return SP_ERR_INVALID;
    }
    const std::string base = prefix + "/split/" + std::to_string(seq) + "/";
    const int32_t mine[2] = {color, key};
    if (int rc = store->set(base + std::to_string(rank), mine, sizeof mine, err)) return rc;
    for (int r = 0; r < size; ++r) {
      std::vector<char> v;
      if (int rc = store->get(base + std::to_string(r), &v, timeout, &aborted, err)) return rc;
      int32_t theirs[2];
      if (v.size() != sizeof theirs) {
        *err = "malformed split record of rank " + std::to_string(r);
        return SP_ERR_INTERNAL;
      }
      std::memcpy(theirs, v.data(), sizeof theirs);
      if (color >= 0 && theirs[0] == color) members.emplace_back(theirs[1], r);
    }
  }
  if (color < 0) return SP_OK;
  std::sort(members.begin(), members.end());
  int new_rank = 0;
  while (members[new_rank].second != rank) ++new_rank;
  ncclUniqueId id;
  if (new_rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      *err = "ncclGetUniqueId: " + nccl_msg(nullptr, r);
      return status_of(r);
    }
    if (members.size() > 1)
      if (int rc = publish_id(*store, child_prefix + "/id", id, err)) return rc;
  } else if (int rc = fetch_id(*store, child_prefix + "/id", timeout, &aborted, &id, err)) {
    return rc;
  }
  auto c = std::make_shared<Comm>(new_rank, static_cast<int>(members.size()), device, timeout, store, child_prefix,
                                  split_via_store);
  if (int rc = c->init(&id, nullptr, &aborted, err)) return rc;
  *out = std::move(c);
  return SP_OK;
}

}  // namespace sp_nccl
