#include "store.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <sys/stat.h>
#include <thread>

namespace shardplan_bench {

Store::Store() {
  abi_.ctx = this;
  abi_.set = [](void* ctx, const char* key, const void* data, size_t len) -> int {
    auto* s = static_cast<Store*>(ctx);
    try {
      s->set(key, std::string(static_cast<const char*>(data), len));
      return 0;
    } catch (const std::exception& e) {
      s->error_ = e.what();
      return -1;
    }
  };
  abi_.get = [](void* ctx, const char* key, void** data, size_t* len, int64_t timeout_ms) -> int {
    auto* s = static_cast<Store*>(ctx);
    std::string v;
    if (!s->get(key, &v, timeout_ms)) {
      s->error_ = "timed out after " + std::to_string(timeout_ms) + " ms waiting for key '" + key + "'";
      return -1;
    }
    *data = std::malloc(v.size() ? v.size() : 1);
    if (!*data) return -1;
    std::memcpy(*data, v.data(), v.size());
    *len = v.size();
    return 0;
  };
  abi_.check = [](void* ctx, const char* key, int* exists) -> int {
    *exists = static_cast<Store*>(ctx)->check(key) ? 1 : 0;
    return 0;
  };
  abi_.last_error = [](void* ctx) -> const char* { return static_cast<Store*>(ctx)->error_.c_str(); };
}

namespace {

class DirStore final : public Store {
 public:
  explicit DirStore(std::string dir) : dir_(std::move(dir)) { ::mkdir(dir_.c_str(), 0700); }

 protected:
  void set(const std::string& key, const std::string& value) override {
    static std::atomic<unsigned> seq{0};
    const std::string tmp = dir_ + "/.tmp." + std::to_string(::getpid()) + "." + std::to_string(seq++);
    {
      std::ofstream f(tmp, std::ios::binary);
      f.write(value.data(), static_cast<std::streamsize>(value.size()));
      if (!f) throw std::runtime_error("cannot write " + tmp);
    }
    if (std::rename(tmp.c_str(), path(key).c_str()) != 0) throw std::runtime_error("cannot rename " + tmp);
  }
  bool get(const std::string& key, std::string* value, int64_t timeout_ms) override {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    auto pause = std::chrono::microseconds(200);
    for (;;) {
      std::ifstream f(path(key), std::ios::binary);
      if (f) {
        std::ostringstream ss;
        ss << f.rdbuf();
        *value = ss.str();
        return true;
      }
      if (timeout_ms >= 0 && std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(20000));
    }
  }
  bool check(const std::string& key) override {
    struct stat st;
    return ::stat(path(key).c_str(), &st) == 0;
  }

 private:
  // Keys may hold '/' and anything else; hex keeps them one flat file name.
  std::string path(const std::string& key) const {
    static const char* hex = "0123456789abcdef";
    std::string name;
    for (unsigned char c : key) {
      name += hex[c >> 4];
      name += hex[c & 15];
    }
    return dir_ + "/k" + name;
  }
  std::string dir_;
};

class MemoryStore final : public Store {
 protected:
  void set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
  }
  bool get(const std::string& key, std::string* value, int64_t timeout_ms) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [&] { return data_.count(key) > 0; };
    if (timeout_ms < 0) cv_.wait(lock, ready);
    else if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready)) return false;
    *value = data_[key];
    return true;
  }
  bool check(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    return data_.count(key) > 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

}  // namespace

std::unique_ptr<Store> make_dir_store(const std::string& dir) { return std::make_unique<DirStore>(dir); }
std::unique_ptr<Store> make_memory_store() { return std::make_unique<MemoryStore>(); }

}  // namespace shardplan_bench
