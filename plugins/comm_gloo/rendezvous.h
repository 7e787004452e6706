#pragma once
// The key/value stores a gloo communicator meets its peers through: the
// host's sp_store (the framework's TCP/file/memory store) or, for raw use of
// the plugin, gloo's own FileStore in a shared directory.
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/store.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardplan/abi/comm.h"

namespace sp_gloo {

// Carries the sp_status the failure maps to (a timeout is not an I/O error).
class RendezvousError : public std::runtime_error {
 public:
  RendezvousError(const std::string& what, int status) : std::runtime_error(what), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

// gloo's Store plus check(), which a communicator needs to number its
// generations without an atomic counter. get() blocks up to `timeout` like
// gloo expects (connectFullMesh calls it without waiting first).
class KeyStore : public gloo::rendezvous::Store {
 public:
  explicit KeyStore(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  virtual bool check(const std::string& key) = 0;
  virtual std::string describe() const = 0;

  using gloo::rendezvous::Store::wait;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

 protected:
  std::chrono::milliseconds timeout_;
};

class HostStore final : public KeyStore {
 public:
  HostStore(const sp_store& store, std::chrono::milliseconds timeout) : KeyStore(timeout), store_(store) {}
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  bool check(const std::string& key) override;
  std::string describe() const override { return "the framework's store"; }

 private:
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout);
  [[noreturn]] void fail(const char* what, const std::string& key, int status) const;

  // A copy: the host keeps ctx alive, not necessarily the struct.
  sp_store store_;
};

class DirStore final : public KeyStore {
 public:
  DirStore(const std::string& dir, std::chrono::milliseconds timeout);
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  bool check(const std::string& key) override;
  std::string describe() const override { return "file_store=" + dir_; }

 private:
  struct Files : gloo::rendezvous::FileStore {
    using FileStore::FileStore;
    using FileStore::check;
  };
  std::string dir_;
  std::unique_ptr<Files> files_;
};

// Waits by polling check() so that `cancel` (a communicator's abort flag)
// can end a rendezvous whose peers will never come, e.g. a split that a
// failed rank never reached.
class InterruptibleStore final : public gloo::rendezvous::Store {
 public:
  InterruptibleStore(KeyStore& inner, const std::atomic<bool>& cancel, std::chrono::milliseconds timeout)
      : inner_(inner), cancel_(cancel), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { inner_.set(key, data); }
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  KeyStore& inner_;
  const std::atomic<bool>& cancel_;
  std::chrono::milliseconds timeout_;
};

// For a world of one, which has nobody to meet but still needs a context.
class SoloStore final : public KeyStore {
 public:
  explicit SoloStore(std::chrono::milliseconds timeout) : KeyStore(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  bool check(const std::string& key) override;
  std::string describe() const override { return "a private in-process store"; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> data_;
};

}  // namespace sp_gloo
