#include "rendezvous.h"

#include <gloo/common/error.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

namespace sp_gloo {

void HostStore::fail(const char* what, const std::string& key, int status) const {
  const char* why = store_.last_error ? store_.last_error(store_.ctx) : nullptr;
  std::string msg = (why && *why) ? std::string(why) : std::string(what) + " '" + key + "' failed";
  throw RendezvousError(msg, status == SP_ERR_TIMEOUT ? SP_ERR_TIMEOUT : SP_ERR_INTERNAL);
}

void HostStore::set(const std::string& key, const std::vector<char>& data) {
  int rc = store_.set(store_.ctx, key.c_str(), data.data(), data.size());
  if (rc != 0) fail("setting key", key, rc);
}

std::vector<char> HostStore::get(const std::string& key) { return get(key, timeout_); }

std::vector<char> HostStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  void* data = nullptr;
  size_t len = 0;
  int rc = store_.get(store_.ctx, key.c_str(), &data, &len, timeout.count());
  if (rc != 0) {
    std::free(data);
    fail("waiting for key", key, rc);
  }
  std::vector<char> out(static_cast<char*>(data), static_cast<char*>(data) + len);
  std::free(data);
  return out;
}

void HostStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  // One deadline for all keys; the first gets the whole timeout exactly so
  // the message quotes the number the user configured.
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    get(keys[i], i == 0 ? timeout : std::max(left, std::chrono::milliseconds(0)));
  }
}

bool HostStore::check(const std::string& key) {
  int exists = 0;
  int rc = store_.check(store_.ctx, key.c_str(), &exists);
  if (rc != 0) fail("looking up key", key, rc);
  return exists != 0;
}

DirStore::DirStore(const std::string& dir, std::chrono::milliseconds timeout) : KeyStore(timeout), dir_(dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  try {
    files_ = std::make_unique<Files>(dir);
  } catch (const std::exception& e) {
    throw RendezvousError("file_store=" + dir + " is not a usable directory", SP_ERR_INVALID);
  }
}

void DirStore::set(const std::string& key, const std::vector<char>& data) {
  try {
    files_->set(key, data);
  } catch (const gloo::Exception& e) {
    throw RendezvousError("file_store=" + dir_ + ": cannot set key '" + key + "': " + e.what(), SP_ERR_INTERNAL);
  }
}

std::vector<char> DirStore::get(const std::string& key) {
  wait({key}, timeout_);
  return files_->get(key);
}

void DirStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto nap = std::chrono::milliseconds(1);
  for (const auto& key : keys) {
    while (!files_->check({key})) {
      if (std::chrono::steady_clock::now() >= deadline)
        throw RendezvousError("rendezvous timed out after " + std::to_string(timeout.count()) +
                                  " ms waiting for key '" + key + "' in file_store=" + dir_,
                              SP_ERR_TIMEOUT);
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::milliseconds(20));
    }
  }
}

bool DirStore::check(const std::string& key) { return files_->check({key}); }

std::vector<char> InterruptibleStore::get(const std::string& key) {
  wait({key}, timeout_);
  return inner_.get(key);
}

void InterruptibleStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto nap = std::chrono::milliseconds(1);
  for (const auto& key : keys) {
    while (!inner_.check(key)) {
      if (cancel_) throw RendezvousError("aborted while waiting for key '" + key + "'", SP_ERR_ABORTED);
      if (std::chrono::steady_clock::now() >= deadline)
        throw RendezvousError("rendezvous timed out after " + std::to_string(timeout.count()) +
                                  " ms waiting for key '" + key + "' in " + inner_.describe(),
                              SP_ERR_TIMEOUT);
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::milliseconds(50));
    }
  }
}

void SoloStore::set(const std::string& key, const std::vector<char>& data) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = data;
  }
  cv_.notify_all();
}

std::vector<char> SoloStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::lock_guard<std::mutex> lock(mu_);
  return data_[key];
}

void SoloStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  for (const auto& key : keys)
    if (!cv_.wait_for(lock, timeout, [&] { return data_.count(key) > 0; }))
      throw RendezvousError("rendezvous timed out waiting for key '" + key + "'", SP_ERR_TIMEOUT);
}

bool SoloStore::check(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.count(key) > 0;
}

}  // namespace sp_gloo
