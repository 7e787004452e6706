#pragma once
// The host's rendezvous store (sp_store), through which ranks share NCCL's
// unique ids and a split without ncclCommSplit meets its peers.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "nccl_support.h"
#include "shardplan/abi/comm.h"

namespace sp_nccl {

// The host's rendezvous store, for NCCL's unique ids.
class Store {
 public:
  explicit Store(const sp_store& s) : s_(s) {}

  int set(const std::string& key, const void* data, size_t len, std::string* err) {
    if (s_.set(s_.ctx, key.c_str(), data, len) == 0) return SP_OK;
    *err = why("setting", key);
    return SP_ERR_INTERNAL;
  }

  int check(const std::string& key, bool* exists, std::string* err) {
    int e = 0;
    if (s_.check(s_.ctx, key.c_str(), &e) != 0) {
      *err = why("looking up", key);
      return SP_ERR_INTERNAL;
    }
    *exists = e != 0;
    return SP_OK;
  }

  // Waits by polling check() so that `cancel` (an abort) can end a wait for
  // a peer that will never publish, e.g. one that failed before a split.
  int get(const std::string& key, std::vector<char>* out, ms timeout, const std::atomic<bool>* cancel,
          std::string* err) {
    if (cancel) {
      const auto deadline = Clock::now() + timeout;
      auto nap = ms(1);
      for (;;) {
        bool exists = false;
        if (int rc = check(key, &exists, err)) return rc;
        if (exists) break;
        if (*cancel) {
          *err = "aborted while waiting for key '" + key + "' in the store";
          return SP_ERR_ABORTED;
        }
        if (Clock::now() > deadline) {
          *err = "timed out after " + std::to_string(timeout.count()) + " ms waiting for key '" + key +
                 "' in the store";
          return SP_ERR_TIMEOUT;
        }
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, ms(50));
      }
    }
    void* data = nullptr;
    size_t len = 0;
    int rc = s_.get(s_.ctx, key.c_str(), &data, &len, timeout.count());
    if (rc != 0) {
      std::free(data);
      *err = why("waiting for", key);
      return rc == SP_ERR_TIMEOUT ? SP_ERR_TIMEOUT : SP_ERR_INTERNAL;
    }
    out->assign(static_cast<char*>(data), static_cast<char*>(data) + len);
    std::free(data);
    return SP_OK;
  }

 private:
  std::string why(const char* what, const std::string& key) const {
    const char* e = s_.last_error ? s_.last_error(s_.ctx) : nullptr;
    return (e && *e) ? std::string(e) : std::string(what) + " key '" + key + "' in the store failed";
  }

  // A copy: the host keeps ctx alive, not necessarily the struct.
  sp_store s_;
};

inline int publish_id(Store& store, const std::string& key, const ncclUniqueId& id, std::string* err) {
  return store.set(key, &id, sizeof id, err);
}

inline int fetch_id(Store& store, const std::string& key, ms timeout, const std::atomic<bool>* cancel, ncclUniqueId* id,
                    std::string* err) {
  std::vector<char> v;
  if (int rc = store.get(key, &v, timeout, cancel, err)) return rc;
  if (v.size() != sizeof *id) {
    *err = "key '" + key + "' holds " + std::to_string(v.size()) + " bytes, not an NCCL unique id of " +
           std::to_string(sizeof *id);
    return SP_ERR_INTERNAL;
  }
  std::memcpy(id, v.data(), sizeof *id);
  return SP_OK;
}

}  // namespace sp_nccl
