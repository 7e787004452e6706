#include "shardplan/store.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "shardplan/error.h"
#include "tcp_store.h"

namespace shardplan {

namespace {

// Timeouts get their own type so the C view can report SP_ERR_TIMEOUT.
class StoreTimeout : public Error {
 public:
  using Error::Error;
};

thread_local std::string t_last_error;

std::string first_line(std::string s) {
  auto nl = s.find('\n');
  if (nl != std::string::npos) s.resize(nl);
  return s;
}

// c10::Error::what() carries a backtrace; users get one line.
std::string reason(const std::exception& e) {
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) return first_line(ce->what_without_backtrace());
  return first_line(e.what());
}

std::string timeout_message(std::chrono::milliseconds timeout, const std::string& key, const std::string& where) {
  return "rendezvous timed out after " + std::to_string(timeout.count()) + " ms waiting for key '" + key +
         "' at " + where;
}

template <typename Fn>
int guarded(Fn&& fn) {
  try {
    fn();
    return SP_OK;
  } catch (const StoreTimeout& e) {
    t_last_error = e.what();
    return SP_ERR_TIMEOUT;
  } catch (const std::exception& e) {
    t_last_error = first_line(e.what());
    return SP_ERR_INTERNAL;
  } catch (...) {
    t_last_error = "unknown error in the rendezvous store";
    return SP_ERR_INTERNAL;
  }
}

int abi_set(void* ctx, const char* key, const void* data, size_t len) {
  return guarded([&] {
    auto* p = static_cast<const uint8_t*>(data);
    static_cast<Store*>(ctx)->set(key, std::vector<uint8_t>(p, p + len));
  });
}

int abi_get(void* ctx, const char* key, void** data, size_t* len, int64_t timeout_ms) {
  *data = nullptr;
  *len = 0;
  return guarded([&] {
    // A negative timeout means "as long as it takes"; a day is long enough
    // and keeps the chrono arithmetic below from overflowing.
    std::chrono::milliseconds t(timeout_ms < 0 ? int64_t(24) * 3600 * 1000 : timeout_ms);
    auto v = static_cast<Store*>(ctx)->get(key, t);
    // malloc(0) may return NULL, which a plugin could mistake for failure.
    void* out = std::malloc(v.empty() ? 1 : v.size());
    if (!out) throw Error("out of memory copying key '" + std::string(key) + "'");
    if (!v.empty()) std::memcpy(out, v.data(), v.size());
    *data = out;
    *len = v.size();
  });
}

int abi_check(void* ctx, const char* key, int* exists) {
  return guarded([&] { *exists = static_cast<Store*>(ctx)->check(key) ? 1 : 0; });
}

const char* abi_last_error(void*) { return t_last_error.c_str(); }

// ------------------------------------------------------------------ TCP

// Our own TCP store (tcp_store.h), not c10d's: libtorch 1.13's TCPStore
// cannot be told where to listen and served every interface. World rank 0
// serves, bound to the master address only; every rank is a client.
class TcpStore final : public Store {
 public:
  TcpStore(const std::string& host, int port, bool is_server, std::chrono::milliseconds timeout) {
    if (is_server) {
      server_ = tcp_store::Server::start(host, port);
      port = server_->port();
    }
    client_ = std::make_unique<tcp_store::Client>(host, port, timeout);
  }

  ~TcpStore() override {
    client_.reset();
    // Peers may still be meeting through it: it serves on until they have
    // gone (or this process exits).
    tcp_store::Server::release(std::move(server_));
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override { client_->set(key, value); }

  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    auto v = client_->get(key, timeout);
    if (!v) throw StoreTimeout(timeout_message(timeout, key, describe()));
    return std::move(*v);
  }

  bool check(const std::string& key) override { return client_->check(key); }

  std::string describe() const override { return client_->describe(); }

 private:
  std::shared_ptr<tcp_store::Server> server_;
  std::unique_ptr<tcp_store::Client> client_;
};

// A part of a store that others serve: `tcp://host:port/PATH` names the keys
// under PATH/ of a store already running there (shardplan launch's node 0
// serves one for the whole job when it may restart it, and each start, a
// rendezvous round, gets a path of its own: no key of an earlier round is
// seen, and no rank serves).
class PrefixStore final : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> inner, std::string path)
      : inner_(std::move(inner)), prefix_(std::move(path) + "/") {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override { inner_->set(prefix_ + key, value); }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return inner_->get(prefix_ + key, timeout);
  }
  bool check(const std::string& key) override { return inner_->check(prefix_ + key); }
  std::string describe() const override { return inner_->describe() + "/" + prefix_.substr(0, prefix_.size() - 1); }

 private:
  std::shared_ptr<Store> inner_;
  std::string prefix_;
};

// ----------------------------------------------------------------- file

// c10d's FileStore. Its own wait() would do, but polling check() keeps one
// mutex-held request at a time and the timeout message ours.
class FileStore final : public Store {
 public:
  FileStore(const std::string& path, int world_size, std::chrono::milliseconds timeout) : path_(path) {
    try {
      auto parent = std::filesystem::path(path).parent_path();
      if (!parent.empty()) std::filesystem::create_directories(parent);
      // c10d opens the file read-only for lookups and retries while it does
      // not exist, so a check() before anybody's first set() would stall for
      // the whole timeout. O_CREAT without O_TRUNC keeps a peer's data.
      int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) throw Error(std::strerror(errno));
      ::close(fd);
      store_ = std::make_unique<c10d::FileStore>(path, std::max(world_size, 1));
      store_->setTimeout(timeout);
    } catch (const std::exception& e) {
      throw Error("cannot open store " + describe() + ": " + reason(e));
    }
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      store_->set(key, value);
    } catch (const std::exception& e) {
      throw Error("store " + describe() + ": cannot set key '" + key + "': " + reason(e));
    }
  }

  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto nap = std::chrono::milliseconds(1);
    while (!check(key)) {
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline) throw StoreTimeout(timeout_message(timeout, key, describe()));
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(nap, deadline - now));
      nap = std::min(nap * 2, std::chrono::milliseconds(20));
    }
    std::lock_guard<std::mutex> lock(mu_);
    try {
      return store_->get(key);
    } catch (const std::exception& e) {
      throw Error("store " + describe() + ": cannot get key '" + key + "': " + reason(e));
    }
  }

  bool check(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      return store_->check({key});
    } catch (const std::exception& e) {
      throw Error("store " + describe() + ": cannot look up key '" + key + "': " + reason(e));
    }
  }

  std::string describe() const override { return "file://" + path_; }

 private:
  std::string path_;
  std::unique_ptr<c10d::FileStore> store_;
  std::mutex mu_;
};

// --------------------------------------------------------------- memory

class MemoryStore final : public Store {
 public:
  MemoryStore() {
    std::ostringstream os;
    os << "memory://" << static_cast<const void*>(this);
    name_ = os.str();
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
  }

  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return data_.count(key) > 0; }))
      throw StoreTimeout(timeout_message(timeout, key, name_));
    return data_[key];
  }

  bool check(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    return data_.count(key) > 0;
  }

  std::string describe() const override { return name_; }

 private:
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<uint8_t>> data_;
};

}  // namespace

Store::Store() {
  abi_.ctx = this;
  abi_.set = &abi_set;
  abi_.get = &abi_get;
  abi_.check = &abi_check;
  abi_.last_error = &abi_last_error;
}

Store::~Store() = default;

std::shared_ptr<Store> make_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                                      std::chrono::milliseconds timeout) {
  (void)world_size;  // every rank meets every other through its own keys; nobody counts
  return std::make_shared<TcpStore>(host, port, is_server, timeout);
}

std::shared_ptr<Store> make_file_store(const std::string& path, int world_size, std::chrono::milliseconds timeout) {
  return std::make_shared<FileStore>(path, world_size, timeout);
}

std::shared_ptr<Store> make_memory_store() { return std::make_shared<MemoryStore>(); }

std::shared_ptr<Store> make_store(const std::string& url, int rank, int world_size,
                                  std::chrono::milliseconds timeout) {
  const std::string tcp = "tcp://", file = "file://";
  if (url.rfind(tcp, 0) == 0) {
    std::string rest = url.substr(tcp.size());
    while (!rest.empty() && rest.back() == '/') rest.pop_back();
    std::string path;
    const size_t slash = rest.find('/', rest.empty() || rest[0] != '[' ? 0 : rest.find(']'));
    if (slash != std::string::npos) {
      path = rest.substr(slash + 1);
      rest = rest.substr(0, slash);
      if (path.empty() || path[0] == '/' || path.find("//") != std::string::npos)
        throw Error("store url '" + url + "': bad key path '" + path + "'");
    }
    std::string host;
    std::string port_text;
    if (!rest.empty() && rest[0] == '[') {  // [v6::addr]:port
      auto close = rest.find(']');
      if (close == std::string::npos) throw Error("store url '" + url + "': unterminated '[' in the host");
      host = rest.substr(1, close - 1);
      if (close + 1 < rest.size() && rest[close + 1] == ':') port_text = rest.substr(close + 2);
    } else {
      auto colon = rest.rfind(':');
      host = rest.substr(0, colon);
      if (colon != std::string::npos) port_text = rest.substr(colon + 1);
    }
    if (host.empty()) throw Error("store url '" + url + "' has no host");
    int port = 29500;  // torchrun's MASTER_PORT default
    if (!port_text.empty()) {
      char* end = nullptr;
      long p = std::strtol(port_text.c_str(), &end, 10);
      if (*end != '\0' || p < 0 || p > 65535) throw Error("store url '" + url + "': bad port '" + port_text + "'");
      port = static_cast<int>(p);
    }
    if (!path.empty()) return std::make_shared<PrefixStore>(make_tcp_store(host, port, false, world_size, timeout), path);
    return make_tcp_store(host, port, rank == 0, world_size, timeout);
  }
  if (url.rfind(file, 0) == 0) {
    std::string path = url.substr(file.size());
    if (path.empty() || path[0] != '/') throw Error("store url '" + url + "' must name an absolute path (file:///dir/store)");
    return make_file_store(path, world_size, timeout);
  }
  throw Error("store url '" + url + "' is neither tcp://host:port nor file:///path");
}

}  // namespace shardplan
