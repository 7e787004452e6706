#pragma once
// Rendezvous key/value store of the framework. Plugins see it through the C
// view `abi()` (abi/comm.h: sp_store), e.g. to meet (gloo) or to exchange a
// unique id (NCCL).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardplan/abi/comm.h"

namespace shardplan {

class Store {
 public:
  Store();
  virtual ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Blocks until the key exists; throws shardplan::Error naming the key and
  // the store's address after `timeout`.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  virtual bool check(const std::string& key) = 0;
  virtual std::string describe() const = 0;  // "tcp://127.0.0.1:29500", "file:///tmp/x"

  const sp_store* abi() const { return &abi_; }

 private:
  sp_store abi_;
};

// Multi-node rendezvous over the framework's own TCP store (unauthenticated,
// like torchrun's). The server (global rank 0) listens on host:port only
// (localhost: 127.0.0.1; 0.0.0.0: every interface, on explicit request);
// everyone, the server's rank too, connects as a client. `world_size` is
// unused: nobody counts arrivals.
std::shared_ptr<Store> make_tcp_store(const std::string& host, int port, bool is_server,
                                      int world_size, std::chrono::milliseconds timeout);
// Single-node rendezvous through a file every rank can reach.
std::shared_ptr<Store> make_file_store(const std::string& path, int world_size,
                                       std::chrono::milliseconds timeout);
// Per-process store for ranks that are threads (tests, --ranks N).
std::shared_ptr<Store> make_memory_store();
// "tcp://host:port", "file:///path"; world rank 0 serves TCP.
std::shared_ptr<Store> make_store(const std::string& url, int rank, int world_size,
                                  std::chrono::milliseconds timeout);

}  // namespace shardplan
