#pragma once
// The rendezvous store the bench hands to plugins (abi/comm.h sp_store): a
// directory for ranks that are processes of one machine, a map for ranks
// that are threads. The framework's stores sit on c10d (libtorch); these two
// keep the bench torch-free.
#include <memory>
#include <string>

#include "shardplan/abi/comm.h"

namespace shardplan_bench {

class Store {
 public:
  virtual ~Store() = default;
  const sp_store* abi() const { return &abi_; }

 protected:
  Store();
  virtual void set(const std::string& key, const std::string& value) = 0;
  // False on timeout (timeout_ms < 0: wait forever).
  virtual bool get(const std::string& key, std::string* value, int64_t timeout_ms) = 0;
  virtual bool check(const std::string& key) = 0;
  std::string error_;

 private:
  sp_store abi_;
};

// One file per key, written under a temporary name and renamed, so a reader
// sees a whole value or nothing.
std::unique_ptr<Store> make_dir_store(const std::string& dir);
std::unique_ptr<Store> make_memory_store();

}  // namespace shardplan_bench
